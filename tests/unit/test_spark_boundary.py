"""Every value that crosses the Spark boundary comes back equal after its encoding and decoding: compaction jobs
and merge outcomes (``shale.compactor.wire``), reprocess rounds, work and written chunks (``shale.reprocess.wire``),
an ingest task's paused partition (``shale.ingest.task.Paused``).
A field added to one of these types without a round trip fails here, not in a Spark task."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.factories import BASE_MS
from tests.unit.metastore.helpers import meta

from shale.block import BlockMeta
from shale.compaction.messages import Assigned
from shale.compactor.merge import MergeResult
from shale.compactor.wire import (
    ERROR_CHARS,
    MergeFailedError,
    decode_job,
    decode_outcome,
    encode_failure,
    encode_job,
    encode_result,
)
from shale.config import IngestConfig, ParserRule
from shale.encoder.chunks import Written, decode_written, encode_written
from shale.ingest.plan import PartitionRange
from shale.ingest.task import ERROR_CHARS as PAUSE_ERROR_CHARS
from shale.ingest.task import TASK_RESULT, Paused
from shale.reprocess.wire import (
    PartitionWork,
    RoundSpec,
    decode_spec,
    decode_work,
    encode_spec,
    encode_work,
)

names = st.from_regex(r"[a-z][a-z0-9-]{0,12}", fullmatch=True)
label_names = st.from_regex(r"[a-z_][a-z0-9_]{0,12}", fullmatch=True)
counts = st.integers(min_value=0, max_value=2**53)
times = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)


@st.composite
def blocks(draw: st.DrawFn) -> BlockMeta:
    start = draw(st.integers(min_value=0, max_value=2**40))
    return meta(tenant=draw(names), topic=draw(names), partition=draw(st.integers(0, 1000)), start=start,
                end=start + draw(st.integers(0, 10**6)), group=draw(st.sampled_from(["backup", "partition"])),
                generation=draw(st.integers(0, 100)), time_ms=BASE_MS + draw(st.integers(0, 10**10)),
                level=draw(st.integers(0, 5)),
                labels=draw(st.lists(st.dictionaries(label_names, st.text(max_size=20), max_size=3), max_size=3)))


ranges = st.builds(PartitionRange, topic=names, partition=st.integers(0, 1000), incarnation=st.text(max_size=30),
                   start=counts, end=counts)


@given(source=st.lists(blocks(), min_size=1, max_size=4), job=names, numbers=st.tuples(counts, counts, counts),
       level=st.integers(0, 5), tenant=names)
def test_a_compaction_job_crosses_unchanged(source: list[BlockMeta], job: str, numbers: tuple[int, int, int],
                                            level: int, tenant: str) -> None:
    token, lease, generation = numbers
    assigned = Assigned(job=job, token=token, lease_expires_at=lease, tenant=tenant, shard=0, level=level,
                        group="backup", generation=generation, sources=source)
    assert decode_job(encode_job(assigned)) == assigned


@given(output=blocks(), rows=st.tuples(counts, counts), size=st.tuples(counts, counts),
       memory=st.tuples(counts, st.integers(-2**40, 2**40), counts), seconds=times)
def test_a_merge_result_crosses_unchanged(output: BlockMeta, rows: tuple[int, int], size: tuple[int, int],
                                          memory: tuple[int, int, int], seconds: float) -> None:
    result = MergeResult(output, *rows, *size, *memory, seconds)
    back = decode_outcome(encode_result(result))
    assert back == result
    assert isinstance(back.output, BlockMeta)


@given(message=st.text(max_size=3000))
def test_a_failed_merge_crosses_as_its_error(message: str) -> None:
    with pytest.raises(MergeFailedError) as caught:
        decode_outcome(encode_failure(ValueError(message)))
    assert str(caught.value) == f"ValueError: {message}"[:ERROR_CHARS]


@given(read_time=counts, generation=st.integers(0, 100), task_bytes=counts, parser=st.just("json"),
       options=st.fixed_dictionaries({"time_field": names}, optional={
           "time_format": st.sampled_from(["iso8601", "epoch_ms", "%Y-%m-%d %H:%M:%S"]),
           "label_fields": st.lists(label_names, max_size=3)}),
       tenant=names)
def test_a_reprocess_round_crosses_unchanged(read_time: int, generation: int, task_bytes: int, parser: str,
                                             options: dict[str, object], tenant: str) -> None:
    ingest = IngestConfig(parsers=[ParserRule(topic_pattern=".*", parser=parser, options=options)],
                          default_tenant=tenant, generation=generation)
    spec = RoundSpec(read_time, generation, ingest, task_bytes)
    assert decode_spec(encode_spec(spec)) == spec


@given(work=ranges, source=st.lists(blocks(), max_size=4))
def test_reprocess_work_crosses_unchanged(work: PartitionRange, source: list[BlockMeta]) -> None:
    task = PartitionWork(work, tuple(source))
    back = decode_work(encode_work(task))
    assert back == task
    assert isinstance(back.range, PartitionRange)


@given(chunks=st.lists(st.builds(Written, topic=names, partition=st.integers(0, 1000), incarnation=st.text(max_size=30),
                                 start=counts, end=counts, records=counts, quarantined=counts, bytes=counts,
                                 blocks=st.lists(blocks(), max_size=2), peak_rss=counts,
                                 seconds=st.dictionaries(names, times, max_size=3)), max_size=3))
def test_written_chunks_cross_unchanged(chunks: list[Written]) -> None:
    assert decode_written(encode_written(chunks)) == chunks


@given(paused=st.builds(Paused, topic=names, partition=st.integers(0, 1000), incarnation=st.text(max_size=30),
                        at=counts, registry=st.text(max_size=100), error=st.text(max_size=PAUSE_ERROR_CHARS)))
def test_a_paused_partition_crosses_unchanged(paused: Paused) -> None:
    # As an ingest task returns it: one row of TASK_RESULT, through Arrow, read back by the driver.
    row = pa.RecordBatch.from_pylist([{"written": None, "paused": paused.model_dump_json()}], schema=TASK_RESULT)
    [back] = [Paused.model_validate_json(r["paused"]) for r in row.to_pylist() if r["paused"] is not None]
    assert back == paused


@given(shared=st.lists(blocks(), min_size=1, max_size=3), ranges=st.integers(1, 40))
def test_a_chunks_shared_blocks_cross_once(shared: list[BlockMeta], ranges: int) -> None:
    """A chunk's ranges all name its blocks: each block crosses once, whatever the number of ranges."""
    chunks = [Written(topic="t", partition=p, start=0, end=1, records=1, quarantined=0, bytes=1, blocks=shared)
              for p in range(ranges)]
    text = encode_written(chunks)
    assert decode_written(text) == chunks
    assert len(json.loads(text)["blocks"]) <= len(shared)
