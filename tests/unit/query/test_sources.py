"""Every block source answers the same: after a generation switch, a query through the metastore's state and one
through the tenant's bucket index return the same rows (the index carries the switches); an index written from a
bucket scan alone, which cannot know them, is refused where the partition group holds several generations."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from tests.factories import BASE_MS, backup_table

from shale.bucketindex import BucketIndexReader, BucketIndexWriter, write_scanned_index
from shale.config import BucketConfig, BucketIndexConfig, IngestConfig, ParserRule
from shale.encoder.chunks import Chunk, GroupSpec, write_chunk
from shale.errors import ShaleError
from shale.ingest.committer import batch_commit
from shale.ingest.plan import PartitionRange
from shale.metastore import MetastoreService, SetActiveGeneration, SingleNodeLog, StateMachine, read_only_index
from shale.objstore import open_bucket
from shale.query import Query, run_query
from shale.query.sources import BucketIndexSource

HOUR = 3_600_000
PARSER = ParserRule(parser="json", options={"time_field": "t", "time_format": "epoch_ms", "label_fields": ["v"]})


def _commit(service: MetastoreService, bucket_config: BucketConfig, generation: int, writer: str) -> None:
    """100 records over 10 hours, parsed into generation ``generation`` (its records say which)."""
    table = backup_table("app", 0, 0, 100)
    values = [json.dumps({"t": BASE_MS + i * HOUR // 10, "v": f"g{generation}"}).encode() for i in range(100)]
    table = table.set_column(table.schema.get_field_index("value"), "value", pa.array(values, pa.binary()))
    spec = GroupSpec("partition", generation, bucket_config, IngestConfig(default_tenant="acme", parsers=[PARSER]))
    written = write_chunk(spec, open_bucket(bucket_config), table, Chunk("app", 0, "", 0, 100, BASE_MS + 11 * HOUR))
    command = batch_commit([written], [PartitionRange("app", 0, "", 0, 100)], group="partition",
                           generation=generation, writer=writer, batch="b")  # type: ignore[arg-type]
    service.submit(command).raise_for_rejection()


@pytest.fixture
def setup(tmp_path: Path) -> tuple[MetastoreService, BucketConfig, Path]:
    bucket_config = BucketConfig(url=f"memory://sources-{uuid.uuid4().hex}")
    path = tmp_path / "state.db"
    state = StateMachine(path)
    service = MetastoreService(state, SingleNodeLog(state))
    _commit(service, bucket_config, 1, "ingest")
    _commit(service, bucket_config, 2, "reprocess")
    return service, bucket_config, path


def _rows(source: object, bucket_config: BucketConfig) -> list[tuple[int, str]]:
    table = run_query(Query("acme", BASE_MS, BASE_MS + 10 * HOUR), source, open_bucket(bucket_config)).read_all()  # type: ignore[arg-type]
    return sorted(zip(table.column("offset").to_pylist(), table.column("v").to_pylist(), strict=True))


def test_both_sources_return_the_same_rows_after_a_switch(setup: tuple[MetastoreService, BucketConfig, Path]) -> None:
    service, bucket_config, path = setup
    service.submit(SetActiveGeneration(tenant="acme", topic="app", generation=2, start=BASE_MS,
                                       end=BASE_MS + 5 * HOUR - 1)).raise_for_rejection()
    BucketIndexWriter(open_bucket(bucket_config), service.state.reader, BucketIndexConfig()).write_tenant("acme")
    through_state = _rows(read_only_index(path), bucket_config)
    through_index = _rows(BucketIndexSource(BucketIndexReader(open_bucket(bucket_config), BucketIndexConfig())),
                          bucket_config)
    assert through_index == through_state
    assert [v for _, v in through_state] == ["g2"] * 50 + ["g1"] * 50  # the switch, and the default after it
    assert [o for o, _ in through_state] == list(range(100))


def test_a_scanned_index_knows_no_switches(setup: tuple[MetastoreService, BucketConfig, Path]) -> None:
    service, bucket_config, _ = setup
    bucket = open_bucket(bucket_config)
    write_scanned_index(bucket, "acme", sync_delay=0)
    source = BucketIndexSource(BucketIndexReader(bucket, BucketIndexConfig()))
    with pytest.raises(ShaleError, match="cannot see generation switches"):
        source.generation_rules("acme")
    # Once the metastore's writer has written it, a later scan keeps the switches it recorded.
    service.submit(SetActiveGeneration(tenant="acme", topic="app", generation=2, start=BASE_MS,
                                       end=BASE_MS + HOUR)).raise_for_rejection()
    BucketIndexWriter(bucket, service.state.reader, BucketIndexConfig()).write_tenant("acme")
    write_scanned_index(bucket, "acme", sync_delay=0)
    fresh = BucketIndexSource(BucketIndexReader(bucket, BucketIndexConfig()))
    assert fresh.generation_rules("acme") == [("app", 0, 2**62, 1), ("app", BASE_MS, BASE_MS + HOUR, 2)]
