"""A repair's rebuild of a damaged block writes it only when the records found are the block's own (issue 26
case 9): a matching row count is not enough — a changed parser, or records whose time range, columns or label
sets differ from the damaged block's metadata, leave the block to quarantine instead."""

from __future__ import annotations

import io
import json
import uuid

import fastavro
import pyarrow as pa
import pytest
from tests.factories import BASE_MS, backup_table, write_backup_block

from shale.block import deterministic_block_id
from shale.config import BucketConfig, IngestConfig, KafkaConfig, ParserRule, SchemaRegistryConfig
from shale.encoder.chunks import Chunk, GroupSpec, write_chunk
from shale.objstore import open_bucket
from shale.repair.build import rebuild
from shale.repair.model import BuildRequest
from shale.schemas.registry import RegisteredSchema, RegistryClient
from shale.schemas.wire import frame

PARSER = ParserRule(parser="json", options={"time_field": "n", "time_format": "epoch_s", "label_fields": ["msg"]})


def _spec(bucket: BucketConfig, parser: ParserRule) -> GroupSpec:
    return GroupSpec("partition", 1, bucket, IngestConfig(parsers=[parser]))


@pytest.mark.parametrize(("parser", "problem"), [
    (PARSER, ""),
    (ParserRule(parser="json", options={**PARSER.options, "label_fields": []}), "this configuration parses"),
    (ParserRule(parser="json", options={**PARSER.options, "time_format": "epoch_ms"}), "this configuration parses"),
])
def test_a_rebuild_refuses_records_parsed_otherwise(parser: ParserRule, problem: str) -> None:
    config = BucketConfig(url=f"memory://rebuild-{uuid.uuid4().hex}")
    bucket = open_bucket(config)
    source = write_backup_block(bucket, "default", "app", 0, 0, 10)
    written = write_chunk(_spec(config, PARSER), bucket, backup_table("app", 0, 0, 10), Chunk(
        "app", 0, "", 0, 10, BASE_MS))
    [damaged] = [m for m in written.blocks if m.datasets and m.datasets[0].kind == "records"]
    request = BuildRequest(action="rebuild", output=deterministic_block_id(BASE_MS, "rebuilt"), attempt=0,
                           inputs=[damaged], source="backup", source_blocks=[source])
    result = rebuild(bucket, request, _spec(config, parser), KafkaConfig())
    assert problem in result.problem
    if not problem:
        assert result.output is not None
        assert result.output.rows == damaged.rows
        assert result.output.datasets[0].labels == damaged.datasets[0].labels
    else:
        assert result.output is None


def test_a_rebuild_keeps_each_record_type_of_a_topic_stored_per_type() -> None:
    """subject_name_strategy record: the rebuilt block holds the damaged block's datasets, one per record type."""
    registry = SchemaRegistryConfig(url="http://127.0.0.1:1/apis/ccompat/v7", timeout=2.0)  # schemas cached: no I/O
    schemas = {f"shop.{name}": {"type": "record", "name": name, "namespace": "shop",
                                "fields": [{"name": f"{name.lower()}_id", "type": "long"}]}
               for name in ("Order", "Refund")}
    ids = dict(zip(schemas, (96_001, 96_002), strict=True))
    for kind, schema in schemas.items():
        RegistryClient(registry).remember(RegisteredSchema(ids[kind], "AVRO", json.dumps(schema)))
    values = []
    for n in range(10):
        kind = "shop.Order" if n % 3 else "shop.Refund"
        out = io.BytesIO()
        fastavro.schemaless_writer(out, fastavro.parse_schema(schemas[kind]), {f"{kind[5:].lower()}_id": n})
        values.append(frame(ids[kind], out.getvalue()))
    table = backup_table("app", 0, 0, 10)
    table = table.set_column(table.schema.get_field_index("value"), "value", pa.array(values, pa.binary()))
    config = BucketConfig(url=f"memory://rebuild-{uuid.uuid4().hex}")
    bucket = open_bucket(config)
    ingest = IngestConfig(parsers=[ParserRule(parser="avro", options={"subject_name_strategy": "record"})],
                          schema_registry=registry)
    chunk = Chunk("app", 0, "", 0, 10, BASE_MS)
    [source] = write_chunk(GroupSpec("backup", 1, config, ingest), bucket, table, chunk).blocks
    [damaged] = write_chunk(GroupSpec("partition", 1, config, ingest), bucket, table, chunk).blocks
    assert [d.record for d in damaged.datasets] == ["shop.Order", "shop.Refund"]
    request = BuildRequest(action="rebuild", output=deterministic_block_id(BASE_MS, "rebuilt"), attempt=0,
                           inputs=[damaged], source="backup", source_blocks=[source])
    result = rebuild(bucket, request, GroupSpec("partition", 1, config, ingest), KafkaConfig())
    assert result.problem == ""
    assert result.output is not None
    assert [(d.name, d.record, d.rows, d.labels) for d in result.output.datasets] == [
        (d.name, d.record, d.rows, d.labels) for d in damaged.datasets]


def test_a_rebuilt_block_supersedes_its_damaged_source_in_a_bucket_scan() -> None:
    """The rebuilt block's lineage is the damaged block's and its own id (as an erase rewrite's,
    ``shale.compactor.erase.erased_lineage``): a bucket scanner that sees both unmarked judges the damaged one
    overlapped, whichever id is greater. Before, the lineage was the damaged block's alone: with equal source sets
    the greater id won, here the damaged block's."""
    from shale.block.fetcher import BlockState, BlockView, _judge_overlaps

    config = BucketConfig(url=f"memory://rebuild-{uuid.uuid4().hex}")
    bucket = open_bucket(config)
    source = write_backup_block(bucket, "default", "app", 0, 0, 10)
    written = write_chunk(_spec(config, PARSER), bucket, backup_table("app", 0, 0, 10), Chunk(
        "app", 0, "", 0, 10, BASE_MS))
    [damaged] = [m for m in written.blocks if m.datasets and m.datasets[0].kind == "records"]
    output = deterministic_block_id(BASE_MS - 86_400_000, "rebuilt")  # an id below the damaged block's
    assert output < damaged.id
    request = BuildRequest(action="rebuild", output=output, attempt=0, inputs=[damaged], source="backup",
                           source_blocks=[source])
    rebuilt = rebuild(bucket, request, _spec(config, PARSER), KafkaConfig()).output
    assert rebuilt is not None
    assert set(rebuilt.compaction.sources) == {*damaged.compaction.sources, rebuilt.id}
    views = [BlockView(tenant="default", id=m.id, state=BlockState.HEALTHY, age=3600.0, meta=m)
             for m in (damaged, rebuilt)]
    _judge_overlaps(views)
    assert [(v.id, v.state, v.overlapped_by) for v in views] == [
        (damaged.id, BlockState.HEALTHY_OVERLAPPED, rebuilt.id), (rebuilt.id, BlockState.HEALTHY, None)]
