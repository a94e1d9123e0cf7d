"""What the registry client makes of each answer, from a real HTTP server on loopback.

Only the registry's own "not found" (HTTP 404 with the Confluent-compatible JSON body and its error code: 40403
for a schema id, 40401 or 40402 for a subject or a version) makes a schema unknown, and so its records
unreadable. Every other answer that is not a schema (a proxy's error page, a url without ``/apis/ccompat/v7``,
401/403, 5xx, a body that is not the registry's JSON, connection refused, a timeout) is
``RegistryUnavailableError``: retryable, the partition pauses and nothing is quarantined. The bodies below are
what Apicurio 3.0.9 answers (checked against the real one: tests/integration/test_registry_failures.py).
"""

from __future__ import annotations

import itertools
import json
import socket
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from tests.factories import BASE_MS, backup_table

from shale.config import BucketConfig, IngestConfig, ParserRule, SchemaRegistryConfig
from shale.encoder.chunks import GroupSpec
from shale.errors import NotFoundError, RetryableError
from shale.ingest.plan import BatchPlan, PartitionRange
from shale.ingest.task import ChunkWriter
from shale.objstore import open_bucket
from shale.schemas import frame
from shale.schemas.registry import (
    RegistryClient,
    RegistryUnavailableError,
    SchemaReference,
    UnknownSchemaError,
)

APICURIO_UNKNOWN_ID = (404, "application/json", '{"message":"No content with ID \'424242\' was found.",'
                                                '"error_code":40403}')
APICURIO_UNKNOWN_SUBJECT = (404, "application/json", '{"message":"No artifact with ID \'nope\' in group \'null\' '
                                                     'was found.","error_code":40401}')
APICURIO_UNKNOWN_VERSION = (404, "application/json", '{"message":"No version \'9\' found for artifact with ID '
                                                     '\'s1\' in group \'null\'.","error_code":40402}')
APICURIO_NO_SUCH_PATH = (404, "application/json", '{"detail":"NotFoundException: RESTEASY003210: Could not find '
                                                  'resource for full path: http://127.0.0.1/schemas/ids/1",'
                                                  '"title":"RESTEASY003210","status":404,'
                                                  '"name":"NotFoundException"}')
"""Apicurio's answer to a url without ``/apis/ccompat/v7``."""
PROXY_PAGE = (404, "text/html", "<html><body><h1>404 Not Found</h1>nginx</body></html>")
EMPTY_404 = (404, "application/json", "")
"""Apicurio's answer to an unknown path under ``/apis/ccompat/v7``."""
SCHEMA = {"type": "record", "name": "Payment", "fields": [{"name": "n", "type": "long"}]}
OK = (200, "application/vnd.schemaregistry.v1+json", json.dumps({"schema": json.dumps(SCHEMA)}))
READ_MS = BASE_MS + 7 * 86_400_000
_ids = itertools.count(7_000_000)


@dataclass
class Answer:
    status: int
    content_type: str
    body: str


class FakeRegistry(ThreadingHTTPServer):
    """Answers every GET with ``answer`` (set by the test) and records the paths asked."""

    answer = Answer(*OK)
    asked: list[str]


class _Handler(BaseHTTPRequestHandler):
    server: FakeRegistry

    def do_GET(self) -> None:
        self.server.asked.append(self.path)
        answer = self.server.answer
        body = answer.body.encode()
        self.send_response(answer.status)
        self.send_header("Content-Type", answer.content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def registry() -> Iterator[FakeRegistry]:
    server = FakeRegistry(("127.0.0.1", 0), _Handler)
    server.asked = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _url(server: FakeRegistry) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}/apis/ccompat/v7"


def _client(server: FakeRegistry, answer: tuple[int, str, str]) -> RegistryClient:
    server.answer = Answer(*answer)
    return RegistryClient(SchemaRegistryConfig(url=_url(server), timeout=5.0))


# --- each failure class ------------------------------------------------------------------------------------------

def test_only_the_registrys_own_not_found_code_makes_a_schema_id_unknown(registry: FakeRegistry) -> None:
    sid = next(_ids)
    with pytest.raises(UnknownSchemaError, match=rf"schema id {sid} does not exist in the schema registry") as exc:
        _client(registry, APICURIO_UNKNOWN_ID).schema(sid)
    assert isinstance(exc.value, NotFoundError)
    assert not isinstance(exc.value, RetryableError)
    assert registry.asked[-1] == f"/apis/ccompat/v7/schemas/ids/{sid}"


@pytest.mark.parametrize("answer", [APICURIO_NO_SUCH_PATH, PROXY_PAGE, EMPTY_404, APICURIO_UNKNOWN_SUBJECT,
                                    (404, "application/json", '{"error_code": "40403"}'),
                                    (404, "application/json", "[40403]")],
                         ids=["wrong-base-url", "proxy-page", "empty", "subject-code-for-an-id", "code-as-text",
                              "not-an-object"])
def test_case5_a_404_without_the_registrys_code_is_retryable_and_says_to_check_the_url(
        registry: FakeRegistry, answer: tuple[int, str, str]) -> None:
    sid = next(_ids)
    client = _client(registry, answer)
    with pytest.raises(RegistryUnavailableError) as exc:
        client.schema(sid)
    message = str(exc.value)
    assert f"GET {client.url}/schemas/ids/{sid}" in message
    assert "ingest.schema_registry.url" in message
    assert "/apis/ccompat/v7" in message
    assert exc.value.registry == client.url
    assert client.cached(sid) is None  # asked again next time: a registry that comes back is read


@pytest.mark.parametrize(("status", "check"), [(401, "username and password"), (403, "username and password"),
                                               (500, "health"), (502, "health"), (503, "health"), (400, "health")])
def test_refusals_and_server_errors_are_retryable_and_say_what_to_check(
        registry: FakeRegistry, status: int, check: str) -> None:
    client = _client(registry, (status, "application/json", '{"error_code": 40403, "message": "x"}'))
    with pytest.raises(RegistryUnavailableError, match=rf"HTTP {status}.*{check}"):
        client.schema(next(_ids))


@pytest.mark.parametrize("body", ["<html>it works</html>", "{}", '{"schema": null, "references": 5}', "[]"])
def test_an_answer_that_is_not_a_schema_is_retryable(registry: FakeRegistry, body: str) -> None:
    with pytest.raises(RegistryUnavailableError, match=r"not a schema.*Confluent-compatible"):
        _client(registry, (200, "text/html", body)).schema(next(_ids))


def test_connection_refused_is_retryable_and_names_the_url_without_a_secret() -> None:
    with socket.socket() as probe:  # a port nothing listens on (bound, never listening)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        config = SchemaRegistryConfig(url=f"http://127.0.0.1:{port}/apis/ccompat/v7", username="ops",
                                      password="hunter2-secret", timeout=2.0)
        with pytest.raises(RegistryUnavailableError) as exc:
            RegistryClient(config).schema(next(_ids))
    message = str(exc.value)
    assert f"did not answer GET http://127.0.0.1:{port}/apis/ccompat/v7/schemas/ids/" in message
    assert "host and port" in message
    assert "hunter2" not in message


def test_a_timeout_is_retryable() -> None:
    with socket.socket() as silent:  # accepts connections (the kernel's backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        config = SchemaRegistryConfig(url=f"http://127.0.0.1:{silent.getsockname()[1]}", timeout=0.3)
        with pytest.raises(RegistryUnavailableError, match=r"did not answer.*Timeout"):
            RegistryClient(config).schema(next(_ids))


def test_a_reference_or_a_version_is_unknown_only_on_the_registrys_subject_or_version_code(
        registry: FakeRegistry) -> None:
    reference = SchemaReference("common.proto", f"common-{uuid.uuid4().hex}", 1)
    for answer in (APICURIO_UNKNOWN_SUBJECT, APICURIO_UNKNOWN_VERSION):
        with pytest.raises(UnknownSchemaError, match=r"does not exist in the schema registry \(error 4040[12]\)"):
            _client(registry, answer).referenced(reference)
        with pytest.raises(UnknownSchemaError):
            _client(registry, answer).version("s1", 9)
    for answer in (APICURIO_NO_SUCH_PATH, PROXY_PAGE, APICURIO_UNKNOWN_ID):
        with pytest.raises(RegistryUnavailableError):
            _client(registry, answer).referenced(reference)
        with pytest.raises(RegistryUnavailableError):
            _client(registry, answer).version("s1", "latest")


# --- the rule, over any answer ----------------------------------------------------------------------------------

_bodies = st.one_of(
    st.builds(lambda code, extra: json.dumps({"error_code": code, "message": extra}),
              st.one_of(st.sampled_from([40401, 40402, 40403, 404, 40400, 50001]), st.integers(-1, 10**6),
                        st.booleans(), st.text(max_size=5), st.none()), st.text(max_size=20)),
    st.builds(json.dumps, st.one_of(st.dictionaries(st.text(max_size=8), st.integers()),
                                                       st.lists(st.integers(), max_size=3), st.integers())),
    st.text(max_size=40),
    st.just(OK[2]),
    st.builds(lambda schema: json.dumps({"schema": schema}), st.one_of(st.integers(), st.none(), st.lists(st.text()))),
)


@given(status=st.sampled_from([200, 201, 204, 301, 400, 401, 403, 404, 408, 409, 422, 429, 500, 502, 503, 504]),
       body=_bodies)
@example(status=404, body=APICURIO_UNKNOWN_ID[2])
@example(status=404, body=APICURIO_NO_SUCH_PATH[2])
@example(status=404, body=json.dumps({"error_code": True}))
@example(status=200, body=OK[2])
@example(status=200, body=json.dumps({"schema": 3}))
def test_any_answer_is_a_schema_the_registrys_own_not_found_or_retryable(status: int, body: str) -> None:
    """Never any other exception, and a schema id is unknown exactly when the answer is 404 with error code
    40403 in a JSON object."""
    server = _PROPERTY_SERVER
    client = _client(server, (status, "application/json", body))
    sid = next(_ids)
    try:
        decoded: Any = json.loads(body)
    except ValueError:
        decoded = None
    code = decoded.get("error_code") if isinstance(decoded, dict) else None
    registry_says_unknown = status == 404 and code == 40403 and not isinstance(code, bool)
    outcome: object
    try:
        found = client.schema(sid)
        outcome = (found.id, json.loads(found.text))
    except UnknownSchemaError:
        outcome = "unknown"
    except RegistryUnavailableError as exc:
        outcome = ("unavailable", exc.registry)
    if registry_says_unknown:
        assert outcome == "unknown"
    elif status == 200 and body == OK[2]:
        assert outcome == (sid, SCHEMA)
    else:
        assert outcome == ("unavailable", client.url)


def _start_property_server() -> FakeRegistry:
    server = FakeRegistry(("127.0.0.1", 0), _Handler)
    server.asked = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


_PROPERTY_SERVER = _start_property_server()
"""One server for every example of the property (a fixture is not reset between examples)."""


# --- what an ingest task does with it ----------------------------------------------------------------------------

def _records(sids: list[int]) -> pa.Table:
    import io

    table = backup_table("pay", 0, 0, len(sids))
    values = []
    for i, sid in enumerate(sids):
        out = io.BytesIO()
        fastavro.schemaless_writer(out, fastavro.parse_schema(SCHEMA), {"n": i})
        values.append(frame(sid, out.getvalue()))
    return table.set_column(table.schema.get_field_index("value"), "value", pa.array(values, pa.binary()))


@pytest.mark.parametrize("answer", [APICURIO_NO_SUCH_PATH, PROXY_PAGE, EMPTY_404],
                         ids=["wrong-base-url", "proxy-page", "empty"])
def test_case5_an_ingest_task_pauses_the_partition_on_a_404_that_is_not_the_registrys_and_quarantines_nothing(
        registry: FakeRegistry, answer: tuple[int, str, str]) -> None:
    registry.answer = Answer(*answer)
    config = SchemaRegistryConfig(url=_url(registry), timeout=5.0)
    spec = GroupSpec("partition", 1, BucketConfig(url=f"memory://case5-{uuid.uuid4().hex}"),
                     IngestConfig(parsers=[ParserRule(parser="avro", options={})], schema_registry=config))
    plan = BatchPlan(READ_MS, [PartitionRange("pay", 0, "", 0, 6)])
    writer = ChunkWriter(spec, open_bucket(spec.bucket), plan, chunk_bytes=600, pausable=True)
    sid = next(_ids)
    written = writer.add_table(_records([sid] * 6)) + writer.finish()
    assert written == []  # no block at all: neither records nor quarantine
    [paused] = writer.pauses
    assert (paused.at, paused.registry) == (0, config.url)
    assert "ingest.schema_registry.url" in paused.error
    assert list(open_bucket(spec.bucket).list("")) == []


def test_an_ingest_task_still_quarantines_records_of_an_id_the_registry_says_does_not_exist(
        registry: FakeRegistry) -> None:
    registry.answer = Answer(*APICURIO_UNKNOWN_ID)
    config = SchemaRegistryConfig(url=_url(registry), timeout=5.0)
    spec = GroupSpec("partition", 1, BucketConfig(url=f"memory://unknown-{uuid.uuid4().hex}"),
                     IngestConfig(parsers=[ParserRule(parser="avro", options={})], schema_registry=config))
    plan = BatchPlan(READ_MS, [PartitionRange("pay", 0, "", 0, 4)])
    writer = ChunkWriter(spec, open_bucket(spec.bucket), plan, chunk_bytes=10**6, pausable=True)
    written = writer.add_table(_records([next(_ids)] * 4)) + writer.finish()
    assert writer.pauses == []
    assert sum(w.quarantined for w in written) == sum(w.records for w in written) == 4
    assert any("does not exist in the schema registry" in reason for w in written for reason in w.reasons)
