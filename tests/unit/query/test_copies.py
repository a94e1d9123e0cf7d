"""A query returns each Kafka record once: across topic incarnations (a recreated topic starts again at offset
0: other records, not copies) and across generations (issue 26, cases 1 and 12)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
from tests.factories import BASE_MS, backup_table, write_backup_block

from shale.block import BlockMeta, BlockSpec, DatasetInput, KafkaRange, deterministic_block_id, write_block
from shale.block.schemas import partition_schema
from shale.metastore import (
    CommitIngestBatch,
    MetastoreService,
    OffsetRange,
    SingleNodeLog,
    StateMachine,
    read_only_index,
)
from shale.objstore import Bucket, open_bucket_url
from shale.query import Query, run_query

OLD, NEW = "AAAAAAAAAAAAAAAAAAAAAA", "BBBBBBBBBBBBBBBBBBBBBB"


class Blocks:
    """A block source over a list (the metastore and the bucket index answer the same two questions)."""

    def __init__(self, blocks: list[BlockMeta], rules: list[tuple[str, int, int, int]] | None = None) -> None:
        self.blocks, self.rules = blocks, rules or []

    def query_blocks(self, tenants: Sequence[str], start: int, end: int, selector: str = "",
                     group: str | None = None) -> list[BlockMeta]:
        return [b for b in self.blocks if group in (None, b.group)]

    def generation_rules(self, tenant: str) -> list[tuple[str, int, int, int]]:
        return self.rules


def _rows(blocks: list[BlockMeta], bucket_url: str) -> pa.Table:
    query = Query("acme", BASE_MS - 1000, BASE_MS + 3_600_000, group="backup")
    return run_query(query, Blocks(blocks), open_bucket_url(bucket_url)).read_all()


def test_a_query_across_two_incarnations_returns_every_record() -> None:
    url = "memory://query-incarnations"
    bucket = open_bucket_url(url)
    blocks = [write_backup_block(bucket, "acme", "app", 0, 0, 3, incarnation=inc) for inc in (OLD, NEW)]
    # A copy of the new incarnation's block (a block written twice): its rows are dropped, the old topic's kept.
    blocks.append(write_backup_block(bucket, "acme", "app", 0, 1, 2, incarnation=NEW, block_time_ms=BASE_MS + 7))
    table = _rows(blocks, url)
    assert table.num_rows == 6
    assert sorted(table.column("offset").to_pylist()) == [0, 0, 1, 1, 2, 2]


def test_a_backup_query_returns_a_record_stored_in_two_generations_once() -> None:
    url = "memory://query-backup-generations"
    bucket = open_bucket_url(url)
    blocks = [write_backup_block(bucket, "acme", "app", 0, 0, 3, generation=g) for g in (1, 2)]
    table = _rows(blocks, url)
    assert sorted(table.column("offset").to_pylist()) == [0, 1, 2]


def _partition_block(bucket: Bucket, key: str, start: int, values: list[str], generation: int = 1,
                     column: str = "host") -> BlockMeta:
    """A level-0 partition-group block of offsets ``[start, start + len(values))`` of app[0], one parser column."""
    base = backup_table("app", 0, start, len(values), base_ms=BASE_MS + start * 1000)  # a record's time: its offset's
    table = base.append_column("event_time", base.column("timestamp").cast(pa.timestamp("us", tz="UTC")))
    table = table.append_column("dt", pa.array(["2026-11-18"] * len(values)))
    table = table.append_column("hour", pa.nulls(len(values), pa.int8())).append_column(column, pa.array(values))
    spec = BlockSpec(id=deterministic_block_id(BASE_MS, key), tenant="acme", group="partition", generation=generation,
                     kafka=[KafkaRange(topic="app", partition=0, start=start, end=start + len(values))],
                     partition_values={"dt": "2026-11-18"})
    labels = [{"topic": "app", "dt": "2026-11-18", column: v} for v in values]
    return write_block(bucket, spec, [DatasetInput("records", "app", table.cast(partition_schema([column])),
                                                   "event_time", labels=labels)])


def test_raising_the_generation_hides_no_older_record(tmp_path: Path) -> None:
    """Issue 26 case 12: ingest raised to generation 2 for an upgrade re-reads what Kafka still holds (offsets 2-4;
    0-1 are gone from Kafka and only in generation 1). Queries took the querying process's own ingest.generation
    where no switch was recorded, so one configured with 2 lost offsets 0-1, one with 1 lost offset 4. The
    metastore now records the switch itself, when generation 2 has caught up (issue 39 case 9): from the time after
    generation 1's block that holds offsets generation 2 lacks (0-1) on, so offsets 2-3 stay generation 1's."""
    bucket = open_bucket_url(f"memory://query-upgrade-{uuid.uuid4().hex}")
    state = StateMachine(tmp_path / "state.db")
    service = MetastoreService(state, SingleNodeLog(state))
    for generation, start, values in ((1, 0, ["a0", "a1", "a2", "a3"]), (2, 2, ["b2", "b3", "b4"])):
        block = _partition_block(bucket, f"g{generation}", start, values, generation=generation)
        service.submit(CommitIngestBatch(group="partition", generation=generation, writer="ingest", blocks=[block],
                                         ranges=[OffsetRange(topic="app", partition=0, start=start,
                                                             end=start + len(values))])).raise_for_rejection()
    assert state.reader.generation_rules("acme") == [("app", 0, 2**62, 1), ("app", BASE_MS + 3001, 2**62, 2)]
    for configured in (1, 2):
        query = Query("acme", BASE_MS - 1000, BASE_MS + 3_600_000, default_generation=configured)
        rows = run_query(query, read_only_index(tmp_path / "state.db"), bucket).read_all()
        assert sorted(zip(rows.column("offset").to_pylist(), rows.column("host").to_pylist(), strict=True)) == [
            (0, "a0"), (1, "a1"), (2, "a2"), (3, "a3"), (4, "b4")]


def test_a_selector_finds_rows_past_the_label_set_cap() -> None:
    """Issue 26 case 2: 600 hosts in one dataset. The block keeps 511 label sets and a "more" set of the labels
    all rows share; the index, the bucket index and the in-process source all prune through
    ``matching_datasets``, which lets a selector on a host past the cap through (and still prunes other topics)."""
    from shale.block.names import MORE_LABEL_SETS
    from shale.block.writer import MAX_LABEL_SETS
    from shale.index import matching_datasets, parse_matchers

    hosts = [f"h{i:04d}" for i in range(600)]
    bucket = open_bucket_url("memory://query-label-cap")
    meta = _partition_block(bucket, "cap", 0, hosts)
    sets = meta.datasets[0].labels
    assert len(sets) == MAX_LABEL_SETS
    assert sets[-1] == {"topic": "app", "dt": "2026-11-18", MORE_LABEL_SETS: "1"}

    def finds(selector: str) -> bool:
        d = meta.datasets[0]
        return matching_datasets([(d.min_time, d.max_time, d.labels)], 0, 2**62, parse_matchers(selector)) == [0]

    assert finds('{host="h0599"}')
    assert finds('{topic="app", host=~"h05.."}')
    assert not finds('{topic="web", host="h0599"}')
    query = Query("acme", BASE_MS - 1000, BASE_MS + 3_600_000, '{host="h0599"}')
    rows = run_query(query, Blocks([meta]), bucket).read_all()
    assert rows.column("host").to_pylist() == ["h0599"]
