"""Property: a query returns exactly the rows a reference filter over every stored row keeps, through the
metastore's index and through the tenant's bucket index, for random label values (newlines, unicode, past the
label-set cap), matchers (=, !=, =~, !~) and time ranges (issue 26, cases 2 and 10)."""

from __future__ import annotations

import itertools
import uuid
from pathlib import Path

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.factories import BASE_MS, backup_table

from shale.block import BlockSpec, DatasetInput, KafkaRange, deterministic_block_id, write_block
from shale.block.schemas import partition_schema
from shale.bucketindex import BucketIndexReader, BucketIndexWriter
from shale.config import BucketIndexConfig
from shale.index import Matcher
from shale.metastore import AddBlocks, MetastoreService, SingleNodeLog, StateMachine, read_only_index
from shale.objstore import open_bucket_url
from shale.query import Query, run_query
from shale.query.sources import BucketIndexSource

VALUES = st.one_of(st.sampled_from(["a", "a\nb", "b", "", "ü\n", "h0599", "x.y"]), st.text(max_size=6))
PATTERNS = st.sampled_from([".*", "a.b", "a", ".", "", "h0.*", "ü.", "[ab]+", ".*\n.*"])
_count = itertools.count()


@st.composite
def matchers(draw: st.DrawFn, values: list[str]) -> Matcher:
    op = draw(st.sampled_from(["=", "!=", "=~", "!~"]))
    value = draw(st.sampled_from(sorted(set(values)))) if op in ("=", "!=") else draw(PATTERNS)
    return Matcher.of("host", op, value)


def _selector(m: Matcher) -> str:
    return "{" + str(m) + "}"


def _check(path: Path, blocks: list[list[str]], matcher: Matcher, low: int, high: int) -> None:
    """Store ``blocks`` (each a list of host values, one row each), index them, and query through the metastore's
    index and the bucket index: each returns exactly the rows the reference filter keeps."""
    bucket = open_bucket_url(f"memory://query-prop-{uuid.uuid4().hex}")
    metas, stored, start = [], [], 0
    for b, values in enumerate(blocks):
        base = backup_table("app", 0, start, len(values), base_ms=BASE_MS + b * 1000, step_ms=10)
        table = base.append_column("event_time", base.column("timestamp").cast(pa.timestamp("us", tz="UTC")))
        table = table.append_column("dt", pa.array(["2026-11-18"] * len(values)))
        table = table.append_column("hour", pa.nulls(len(values), pa.int8())).append_column("host", pa.array(values))
        spec = BlockSpec(id=deterministic_block_id(BASE_MS, f"prop/{next(_count)}"), tenant="acme", group="partition",
                         kafka=[KafkaRange(topic="app", partition=0, start=start, end=start + len(values))],
                         partition_values={"dt": "2026-11-18"})
        labels = [{"topic": "app", "dt": "2026-11-18", "host": v} for v in dict.fromkeys(values)]
        metas.append(write_block(bucket, spec, [DatasetInput("records", "app", table.cast(partition_schema(["host"])),
                                                             "event_time", labels=labels)]))
        stored += [(start + i, BASE_MS + b * 1000 + i * 10, v) for i, v in enumerate(values)]
        start += len(values)
    expected = sorted(o for o, t, v in stored if low <= t <= high and matcher.matches({"host": v}))
    state = StateMachine(path / f"state-{next(_count)}.db")
    MetastoreService(state, SingleNodeLog(state)).submit(AddBlocks(blocks=metas)).raise_for_rejection()
    BucketIndexWriter(bucket, state.reader, BucketIndexConfig()).write_tenant("acme")
    for source in (read_only_index(state.path), BucketIndexSource(BucketIndexReader(bucket, BucketIndexConfig()))):
        rows = run_query(Query("acme", low, high, _selector(matcher)), source, bucket).read_all()  # type: ignore[arg-type]
        assert sorted(rows.column("offset").to_pylist()) == expected, (type(source).__name__, matcher)


WIDE = [f"h{i:04d}" for i in range(600)]


@settings(max_examples=25, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data(), blocks=st.lists(st.lists(VALUES, min_size=1, max_size=40), min_size=1, max_size=3),
       wide=st.booleans())
def test_a_query_is_the_reference_filter(tmp_path: Path, data: st.DataObject, blocks: list[list[str]],
                                         wide: bool) -> None:
    blocks = [*blocks, WIDE] if wide else blocks  # one block with more label sets than a block keeps
    matcher = data.draw(matchers([v for values in blocks for v in values]))
    low = data.draw(st.integers(BASE_MS - 100, BASE_MS + 5000))
    _check(tmp_path, blocks, matcher, low, data.draw(st.integers(low, BASE_MS + 10_000)))


def test_a_label_value_past_the_cap_is_found(tmp_path: Path) -> None:
    """Issue 26 case 2, as the property's input: the block kept the first 512 label sets and pruned the rest."""
    _check(tmp_path, [WIDE], Matcher.of("host", "=", "h0599"), BASE_MS - 100, BASE_MS + 10_000)


def test_a_regex_matches_a_newline_as_the_index_does(tmp_path: Path) -> None:
    """Issue 26 case 10: the index matched ``(?s:a.b)`` but the row filter ``a.b`` without the s flag."""
    _check(tmp_path, [["a\nb", "axb", "ab"]], Matcher.of("host", "=~", "a.b"), BASE_MS - 100, BASE_MS + 10_000)
