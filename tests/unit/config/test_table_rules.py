"""A parser rule's change-table mode and key (docs/design/change-tables.md): checked when the configuration loads."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from shale.config import ParserRule


def test_a_rule_is_an_append_table_unless_it_says_otherwise() -> None:
    assert ParserRule(parser="json", options={"time_field": "ts"}).table == "append"
    rule = ParserRule(parser="json", options={"time_field": "ts"}, table="upsert", key="after.id")
    assert (rule.table, rule.key) == ("upsert", "after.id")


@pytest.mark.parametrize(("table", "key", "error"), [
    ("debezium", "id", "a debezium table's key is the Kafka record key"),
    ("append", "id", "is for table = \"upsert\""),
    ("upsert", "after..id", "is not a column path"),
    ("merge", "", "'append', 'upsert' or 'debezium'"),
])
def test_a_wrong_mode_or_key_is_refused_naming_what_is_allowed(table: str, key: str, error: str) -> None:
    with pytest.raises(ValidationError, match=error):
        ParserRule(parser="json", options={"time_field": "ts"}, table=table, key=key)  # type: ignore[arg-type]
