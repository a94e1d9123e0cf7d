"""A repair's rebuild of a damaged block writes it only when the records found are the block's own (issue 26
case 9): a matching row count is not enough — a changed parser, or records whose time range, columns or label
sets differ from the damaged block's metadata, leave the block to quarantine instead."""

from __future__ import annotations

import uuid

import pytest
from tests.factories import BASE_MS, backup_table, write_backup_block

from shale.block import deterministic_block_id
from shale.config import BucketConfig, IngestConfig, KafkaConfig, ParserRule
from shale.ingest.blocks import Chunk, GroupSpec, write_chunk
from shale.objstore import open_bucket
from shale.repair.build import rebuild
from shale.repair.model import BuildRequest

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
