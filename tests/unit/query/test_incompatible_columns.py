"""An incompatible schema change across blocks (DESIGN 10.8) never gives a wrong value silently: a query whose
newest blocks hold a column under a type older blocks' values cannot be read as fails with an error naming the
column, both types and the block (each side still reads on its own), and compaction refuses to merge such blocks,
writing nothing; a compatible change (a widening) reads and merges typed."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from tests.iceberg_helpers import HOUR, T0, commit, typed_block, v2_columns

from shale.compactor.merge import merge_blocks
from shale.errors import IncompatibleColumnError
from shale.metastore import MetastoreService, SingleNodeLog, StateMachine
from shale.objstore import Bucket, open_bucket_url
from shale.query import Query, run_query

TENANT, TOPIC = "acme", "orders"


@pytest.fixture
def store(tmp_path: Path) -> tuple[MetastoreService, Bucket]:
    state = StateMachine(tmp_path / "state.db")
    return MetastoreService(state, SingleNodeLog(state)), open_bucket_url(f"file://{tmp_path}/bucket")


def _keys(bucket: Bucket) -> set[str]:
    return {o.key for o in bucket.list(f"{TENANT}/")}


def test_a_column_no_one_type_holds_fails_the_query_by_name_and_is_not_merged(store) -> None:
    service, bucket = store
    old = typed_block(bucket, TENANT, TOPIC, 0, 2, v2_columns(0, 2) | {"qty": pa.array(["a", "b"], pa.string())})
    new = typed_block(bucket, TENANT, TOPIC, 2, 2, v2_columns(2, 2))  # qty: int64, newer: the query's type
    commit(service, [old, new])
    with pytest.raises(IncompatibleColumnError) as failed:
        run_query(Query(TENANT, 0, T0 + HOUR, f'{{topic="{TOPIC}"}}'), service, bucket).read_all()
    message = str(failed.value)
    assert "'qty'" in message
    assert old.id in message
    assert "string" in message
    assert "int64" in message
    newer_only = run_query(Query(TENANT, T0 + 2000, T0 + HOUR, f'{{topic="{TOPIC}"}}'), service, bucket).read_all()
    assert newer_only.column("qty").to_pylist() == [2**40 + 2, 2**40 + 3]

    before = _keys(bucket)
    with pytest.raises(IncompatibleColumnError, match=f"'qty' is string in block {old.id} and int64 in block"):
        merge_blocks(bucket, [old, new], job="j", token=1, level=0)
    assert _keys(bucket) == before  # nothing written


def test_a_widened_column_reads_and_merges_typed(store) -> None:
    service, bucket = store
    old = typed_block(bucket, TENANT, TOPIC, 0, 2, v2_columns(0, 2) | {"qty": pa.array([1, 2], pa.int32())})
    new = typed_block(bucket, TENANT, TOPIC, 2, 2, v2_columns(2, 2))
    commit(service, [old, new])
    table = run_query(Query(TENANT, 0, T0 + HOUR, f'{{topic="{TOPIC}"}}'), service, bucket).read_all()
    assert table.schema.field("qty").type == pa.int64()
    assert sorted(table.column("qty").to_pylist()) == [1, 2, 2**40 + 2, 2**40 + 3]
    merged = merge_blocks(bucket, [old, new], job="j", token=1, level=0)
    assert merged.rows_out == 4
