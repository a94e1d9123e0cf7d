"""``shale restore offsets`` after an erasure: a consumer group resumes at the first record it had not seen, whether
the erasure removed records from the blocks after the restore sent them (the target holds them; the blocks no
longer do: counting the blocks alone came out low by them, and the group read records twice) or before (the
target never got them)."""

from __future__ import annotations

import uuid

from hypothesis import example, given, settings
from hypothesis import strategies as st
from tests.unit.restore.kafka_stub import StubKafka
from tests.unit.restore.test_restore_model import INCARNATIONS, TARGET, TOPIC, records, restore, write_records

from shale.block import KafkaRange
from shale.config import BucketConfig
from shale.restore import RestoreRange, build_plan
from shale.restore.offsets import translate

SOURCES = range(0, 40, 2)  # offsets 0, 2, 4, ...: Kafka offsets are not contiguous


@settings(max_examples=40, deadline=None)
@given(erased=st.sets(st.sampled_from(list(SOURCES)), max_size=8), before=st.booleans(),
       interleave=st.sampled_from([0, 3]), source=st.integers(0, 41))
@example(erased={4, 6}, before=False, interleave=0, source=10)  # erased after the restore: 2 low
def test_a_translated_offset_counts_the_records_an_erasure_removed_after_the_restore_sent_them(
        erased: set[int], before: bool, interleave: int, source: int) -> None:
    config = BucketConfig(url=f"memory://{uuid.uuid4().hex}")
    a = INCARNATIONS[0]
    rows = records(a, 0, SOURCES, 0)
    ranges = [KafkaRange(topic=TOPIC, partition=0, start=0, end=40, incarnation=a)]
    full = write_records(config, rows, ranges, "full")
    kept = [r for r in rows if r.offset not in erased]
    rewritten = write_records(config, kept, ranges, "rewritten") if kept else None
    if before and rewritten is None:
        return  # nothing left to restore
    _, _, target = restore(config, [rewritten] if before and rewritten else [full],
                           a, target=StubKafka(interleave=interleave))
    now = [rewritten] if rewritten else []
    plan = build_plan(now, tenant="acme", topic=TOPIC, incarnation=a, target_partitions=None,
                      range_=RestoreRange(), recorded=frozenset({0}))
    done = target.progress("job")[0][0]
    got = translate(plan, config, {}, TARGET, {0: source}, anchors=target.anchors("job"), restored={0: done},
                    erased={0: sorted(erased)})[0]
    sent = [r for r in rows if not (before and r.offset in erased)]
    where = {e.value: e.offset for e in target.committed(TARGET, 0)}
    first = next((r for r in sent if r.offset >= source), None)
    assert got == (where[first.value] if first is not None else where[sent[-1].value] + 1)
