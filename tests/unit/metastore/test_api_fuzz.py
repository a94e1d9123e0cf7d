"""Issue 27: the HTTP API fuzzed from its own OpenAPI schema with schemathesis, as an admin and as a reader, against
the real server on loopback: no 5xx, every answer conforms to the schema (status codes listed, bodies of the
documented shape, the content type declared), and a reader changes nothing. Budget: ``EXAMPLES`` generated
requests per operation and token, derandomized (the same requests every run), so it runs in seconds in `make test`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from tests.unit.metastore.helpers import meta
from tests.unit.metastore.served import app_for, issue, served

from shale.metastore import AddBlocks, MetastoreService

EXAMPLES = 5
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture
def fuzzed(tmp_path: Path) -> Iterator[tuple[str, dict[str, Any], MetastoreService, dict[str, str]]]:
    tokens, table = issue(tmp_path)
    app, service = app_for(tmp_path, table)
    service.submit(AddBlocks(blocks=[meta(tenant="acme", start=0), meta(tenant="beta", start=0)]))
    with served(app) as client:
        document = client.get("/v1/openapi.json", headers={"authorization": f"Bearer {tokens['reader-all']}"})
        assert document.status_code == 200
        yield str(client.base_url).rstrip("/"), document.json(), service, tokens


def _fuzz(base_url: str, document: dict[str, Any], token: str) -> None:
    """Every operation of the schema, ``EXAMPLES`` cases each; the first failure fails the test."""
    schema = schemathesis.openapi.from_dict(document)
    headers = {"authorization": f"Bearer {token}"}
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) > 15
    for operation in operations:
        @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy())
        def run(case: Any) -> None:
            case.call_and_validate(base_url=base_url, headers=headers, checks=CHECKS)

        run()


def test_an_admin_gets_no_server_error_and_only_documented_answers(fuzzed) -> None:  # type: ignore[no-untyped-def]
    base_url, document, _, tokens = fuzzed
    _fuzz(base_url, document, tokens["admin"])


def test_a_reader_changes_nothing(fuzzed) -> None:  # type: ignore[no-untyped-def]
    base_url, document, service, tokens = fuzzed
    before = service.state.state_hash()
    _fuzz(base_url, document, tokens["reader-acme"])
    assert service.state.state_hash() == before
