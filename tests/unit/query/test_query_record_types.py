"""A topic of several record types (subject_name_strategy record): compaction merges each type's datasets, never
across types; a query, the Python API and the Spark data source (all through ``Query.plan``) read one type picked
by a ``record`` matcher, and a query that would mix types is refused, naming them."""

from __future__ import annotations

import io
import itertools
import json
import uuid
from collections.abc import Sequence
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.factories import BASE_MS, backup_table

from shale.block import BlockMeta, read_dataset
from shale.compactor.merge import merge_blocks
from shale.config import BucketConfig, IngestConfig, ParserRule, SchemaRegistryConfig
from shale.encoder.chunks import Chunk, GroupSpec, write_chunk
from shale.objstore import Bucket, open_bucket
from shale.query import Query, run_query
from shale.query.sources import BucketIndexSource
from shale.schemas.registry import RegisteredSchema, RegistryClient
from shale.schemas.wire import frame

REGISTRY = SchemaRegistryConfig(url="http://127.0.0.1:1/apis/ccompat/v7", timeout=2.0)
READ_MS = BASE_MS + 7 * 86_400_000
_ids = itertools.count(98_000)
ORDER: dict[str, Any] = {"type": "record", "name": "Order", "namespace": "shop",
                         "fields": [{"name": "id", "type": "long"}, {"name": "amount", "type": "double"}]}
REFUND: dict[str, Any] = {"type": "record", "name": "Refund", "namespace": "shop",
                          "fields": [{"name": "id", "type": "long"}, {"name": "why", "type": "string"}]}


def _register(schema: dict[str, Any]) -> int:
    sid = next(_ids)
    RegistryClient(REGISTRY).remember(RegisteredSchema(sid, "AVRO", json.dumps(schema)))
    return sid


IDS = {"shop.Order": _register(ORDER), "shop.Refund": _register(REFUND)}


def _value(kind: str, n: int) -> bytes:
    schema, datum = (ORDER, {"id": n, "amount": n / 2}) if kind == "shop.Order" else (REFUND, {"id": n, "why": f"w{n}"})
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), datum)
    return frame(IDS[kind], out.getvalue())


class Index:
    """The bucket index's reader over a list of blocks: the source prunes datasets with the index's own rule."""

    def __init__(self, blocks: list[BlockMeta]) -> None:
        self.list = blocks

    def blocks(self, tenant: str) -> list[BlockMeta]:
        return self.list

    def generations(self, tenant: str) -> list[tuple[str, int, int, int]] | None:
        return []

    def full_meta(self, meta: BlockMeta) -> BlockMeta:
        return meta


def _chunks(kinds: Sequence[str], per_chunk: int) -> tuple[Bucket, list[BlockMeta]]:
    spec = GroupSpec("partition", 1, BucketConfig(url=f"memory://records-{uuid.uuid4().hex}"),
                     IngestConfig(parsers=[ParserRule(parser="avro", options={"subject_name_strategy": "record"})],
                                  schema_registry=REGISTRY))
    bucket = open_bucket(spec.bucket)
    blocks: list[BlockMeta] = []
    for start in range(0, len(kinds), per_chunk):
        end = min(start + per_chunk, len(kinds))
        table = backup_table("shop", 0, start, end - start)
        table = table.set_column(table.schema.get_field_index("value"), "value",
                                 pa.array([_value(k, n) for n, k in enumerate(kinds[start:end], start)]))
        written = write_chunk(spec, bucket, table, Chunk("shop", 0, "", start, end, READ_MS))
        assert written.quarantined == 0
        blocks += [m for m in written.blocks if m.datasets]
    return bucket, blocks


def _query(bucket: Bucket, blocks: list[BlockMeta], selector: str) -> pa.Table:
    query = Query("default", BASE_MS - 1000, BASE_MS + 86_400_000, selector)
    return run_query(query, BucketIndexSource(Index(blocks)), bucket).read_all()


@settings(max_examples=25, deadline=None)
@given(kinds=st.lists(st.sampled_from(["shop.Order", "shop.Refund"]), min_size=2, max_size=30),
       per_chunk=st.integers(1, 10))
def test_compaction_merges_each_type_on_its_own_and_a_query_reads_one_type(kinds: list[str], per_chunk: int) -> None:
    bucket, blocks = _chunks(kinds, per_chunk)
    merged = merge_blocks(bucket, blocks, job="j", token=1, level=0).output if len(blocks) > 1 else blocks[0]
    assert sorted(d.record or "" for d in merged.datasets) == sorted(set(kinds))  # one dataset per type
    for dataset in merged.datasets:
        assert dataset.name == f"records/shop/{dataset.record}"
        assert dataset.schema_ids == [IDS[str(dataset.record)]]
        rows = read_dataset(bucket, merged, dataset)
        assert sorted(rows.column("offset").to_pylist()) == [n for n, k in enumerate(kinds) if k == dataset.record]
    for source in (blocks, [merged]):
        for kind in set(kinds):
            rows = _query(bucket, source, f'{{topic="shop", record="{kind}"}}')
            assert sorted(rows.column("id").to_pylist()) == [n for n, k in enumerate(kinds) if k == kind]
            assert ("amount" in rows.column_names) == (kind == "shop.Order")  # only its own type's columns
            assert ("why" in rows.column_names) == (kind == "shop.Refund")


def test_a_query_over_several_types_without_a_record_matcher_is_refused_naming_them() -> None:
    bucket, blocks = _chunks(["shop.Order", "shop.Refund", "shop.Order"], 3)
    for selector in ('{topic="shop"}', '{record=~"shop.*"}', '{record!="x"}'):
        with pytest.raises(ValueError, match=r"several record types: shop\.Order, shop\.Refund; .* "
                                             r'add a record matcher, e\.g\. \{record="shop\.Order"\}'):
            _query(bucket, blocks, selector)
    assert _query(bucket, blocks, '{record=~"shop.Ref.*"}').column("why").to_pylist() == ["w1"]
    assert _query(bucket, blocks, '{record="shop.Nothing"}').num_rows == 0
    quarantine = Query("default", BASE_MS - 1000, BASE_MS + 86_400_000, '{topic="shop"}', kind="quarantine")
    assert run_query(quarantine, BucketIndexSource(Index(blocks)), bucket).read_all().num_rows == 0
