"""A Debezium change table against real Kafka (docs/design/change-tables.md): the test produces a topic of
Debezium change events as its JSON converter writes them with ``schemas.enable=true`` (keys and values each
``{"schema": ..., "payload": ...}``; a snapshot, creates, updates, a delete followed by its tombstone, a key deleted
and created again, two partitions), `shale ingest --available-now` stores it, and `shale query --latest`,
``shale.read(latest=True)`` and the Spark source's ``latest`` option return one row per key, deletes applied, now
and ``--as-of`` a time between two rounds of changes."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from tests.integration.ingest_helpers import config_of, create_topic, finish, ingest_process, write_config
from tests.producing import CheckedProducer

import shale
from shale.cli import cli
from shale.query.datasource import register

FIELDS = [{"type": "int32", "optional": False, "field": "id"}, {"type": "string", "optional": True, "field": "name"}]
KEY_SCHEMA = {"type": "struct", "fields": FIELDS[:1], "optional": False, "name": "shop.public.customers.Key"}
VALUE_SCHEMA = {"type": "struct", "optional": False, "name": "shop.public.customers.Envelope", "fields": [
    {"type": "struct", "fields": FIELDS, "optional": True, "name": "shop.public.customers.Value", "field": "before"},
    {"type": "struct", "fields": FIELDS, "optional": True, "name": "shop.public.customers.Value", "field": "after"},
    {"type": "struct", "optional": False, "name": "io.debezium.connector.postgresql.Source", "field": "source",
     "fields": [{"type": "string", "optional": False, "field": "connector"},
                {"type": "int64", "optional": False, "field": "ts_ms"}]},
    {"type": "string", "optional": False, "field": "op"},
    {"type": "int64", "optional": True, "field": "ts_ms"}]}
PARSER = {"parser": "json", "table": "debezium", "options": {
    "time_field": "payload.ts_ms", "time_format": "epoch_ms",
    "fields": ["payload.op", "payload.after.id", "payload.after.name"], "types": {"payload.after.id": "long"}}}


def _key(row_id: int) -> bytes:
    return json.dumps({"schema": KEY_SCHEMA, "payload": {"id": row_id}}).encode()


def _event(op: str, row_id: int, name: str | None, now: int) -> bytes:
    row = None if name is None else {"id": row_id, "name": name}
    before = {"id": row_id, "name": None} if op in ("u", "d") else None
    payload = {"before": before, "after": None if op == "d" else row, "op": op, "ts_ms": now,
               "source": {"connector": "postgresql", "ts_ms": now}}
    return json.dumps({"schema": VALUE_SCHEMA, "payload": payload}).encode()


def _produce(producer: CheckedProducer, topic: str, changes: list[tuple[str, int, str | None]], at: int) -> None:
    """The changes as Debezium writes them, their source time and Kafka timestamp ``at`` (ms)."""
    for op, row_id, name in changes:
        producer.produce(topic, key=_key(row_id), value=_event(op, row_id, name, at), timestamp=at)
        if op == "d":  # Debezium's tombstone after a delete, for log compaction
            producer.produce(topic, key=_key(row_id), value=None, timestamp=at)  # type: ignore[arg-type]
    producer.producer.flush(60)
    assert producer.errors == []


def _rows(table: Any) -> dict[int, str]:
    return dict(zip(table.column("payload_after_id").to_pylist(), table.column("payload_after_name").to_pylist(),
                    strict=True))


def test_a_debezium_topic_reads_as_its_latest_rows(kafka, minio_bucket, spark, tmp_path: Path) -> None:
    topic = f"shop.public.customers-{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap_servers, topic, 2)
    producer = CheckedProducer({"bootstrap.servers": kafka.bootstrap_servers, "enable.idempotence": True})
    now = int(time.time() * 1000)
    _produce(producer, topic, [("r", i, f"snap{i}") for i in range(1, 6)], now - 3_000)
    _produce(producer, topic, [("c", 6, "six"), ("u", 1, "one"), ("d", 2, None), ("d", 4, None)], now - 2_000)
    between = now - 1_000
    _produce(producer, topic, [("c", 4, "four again"), ("u", 6, "six b"), ("d", 5, None), ("u", 3, "three")], now)
    del producer  # every record is delivered: no client left to reconnect once the broker stops
    expected = {1: "one", 3: "three", 4: "four again", 6: "six b"}
    earlier = {1: "one", 3: "snap3", 5: "snap5", 6: "six"}

    file = write_config(tmp_path, kafka.bootstrap_servers, minio_bucket, [topic], parsers_override=[PARSER])
    finish(ingest_process(file, "partition", tmp_path / "ingest.log", available_now=True))

    selector = f'{{topic="{topic}"}}'
    assert _rows(shale.read(file, tenant="default", selector=selector, latest=True)) == expected
    assert _rows(shale.read(config_of(file), tenant="default", selector=selector, latest=True,
                            as_of=between)) == earlier
    for as_of, want in ((None, expected), (str(between), earlier)):
        args = ["--config", str(file), "query", "--tenant", "default", "--latest", "--format", "json", selector]
        out = CliRunner().invoke(cli, args + (["--as-of", as_of] if as_of else []))
        assert out.exit_code == 0, out.output
        lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
        assert {r["payload_after_id"]: r["payload_after_name"] for r in lines} == want
        assert {r["payload_op"] for r in lines} <= {"r", "c", "u"}
    register(spark)
    for as_of, want in ((None, expected), (str(between), earlier)):
        reader = (spark.read.format("shale").option("config", str(file)).option("tenant", "default")
                  .option("selector", selector).option("latest", "true"))
        rows = (reader.option("as_of", as_of) if as_of else reader).load().collect()
        assert {r["payload_after_id"]: r["payload_after_name"] for r in rows} == want
    # The history is still all there: every change event and tombstone, read as before.
    history = shale.read(file, tenant="default", selector=selector, start="-1h")
    assert history.num_rows == 5 + 4 + 4  # the tombstones are quarantined: they have no value to parse
