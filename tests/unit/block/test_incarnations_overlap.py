"""``incarnations_overlap`` (compaction keeps such partition blocks apart, DESIGN 11.1): one sweep per partition,
checked against the definition, every pair of ranges of the two blocks."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from shale.block import BlockMeta, KafkaRange, incarnations_overlap

A, B = "A" * 22, "B" * 22

_ranges = st.lists(st.tuples(st.sampled_from(["t", "u"]), st.integers(0, 1), st.integers(0, 20), st.integers(0, 6),
                             st.sampled_from(["", A, B])), max_size=6)


def _block(ranges: list[tuple[str, int, int, int, str]]) -> BlockMeta:
    return BlockMeta.model_construct(kafka=[KafkaRange(topic=t, partition=p, start=s, end=s + n, incarnation=i)
                                            for t, p, s, n, i in ranges])


def _definition(a: BlockMeta, b: BlockMeta) -> bool:
    """Two ranges holding rows (an empty range holds none), of one partition and two incarnations, intersect."""
    return any((ra.topic, ra.partition) == (rb.topic, rb.partition) and ra.incarnation != rb.incarnation
               and ra.start < rb.end and rb.start < ra.end and ra.end > ra.start and rb.end > rb.start
               for ra in a.kafka for rb in b.kafka)


@given(a=_ranges, b=_ranges)
@example(a=[("t", 0, 0, 5, A)], b=[("t", 0, 0, 1, B)])  # a topic recreated: offset 0 of each
@example(a=[("t", 0, 0, 5, A), ("t", 0, 3, 4, B)], b=[("t", 0, 0, 5, A)])  # a's own two do not count
@example(a=[("t", 0, 0, 5, A)], b=[("t", 0, 5, 3, B)])  # adjacent: the ranges tell every row's incarnation
@example(a=[("u", 0, 8, 5, B)], b=[("u", 0, 10, 0, "")])  # an empty range holds no row (found by the property)
def test_two_blocks_overlap_in_two_incarnations_exactly_when_two_of_their_ranges_do(
        a: list[tuple[str, int, int, int, str]], b: list[tuple[str, int, int, int, str]]) -> None:
    first, second = _block(a), _block(b)
    assert incarnations_overlap(first, second) == _definition(first, second)
    assert incarnations_overlap(second, first) == _definition(first, second)
