"""A fraction is never stored in an integer column: Arrow's conversion from Python drops it silently
(``pa.array([1.5], pa.int32())`` is ``[1]``), so the chunk writer quarantines such a record whatever its parser
checked. Differential against Arrow itself: a row is refused exactly when Arrow would store another value."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from hypothesis import example, given
from hypothesis import strategies as st

from shale.encoder.parsing import _fraction_into_integer, _truncated

numbers = st.one_of(st.none(), st.integers(-2**31, 2**31 - 1), st.floats(-1e9, 1e9, allow_nan=False),
                    st.sampled_from([1.5, 2.0, -0.5, 7.0]))
TYPES_AND_VALUES = st.one_of(
    st.tuples(st.just(pa.int32()), numbers),
    st.tuples(st.just(pa.int64()), numbers),
    st.tuples(st.just(pa.list_(pa.int32())), st.lists(numbers, max_size=3)),
    st.tuples(st.just(pa.struct([("a", pa.int64()), ("b", pa.string())])),
              st.fixed_dictionaries({"a": numbers, "b": st.just("x")})),
    st.tuples(st.just(pa.map_(pa.string(), pa.int32())), st.lists(st.tuples(st.text(max_size=2), numbers),
                                                                  max_size=3)),
)


@given(TYPES_AND_VALUES)
@example((pa.int32(), 1.5))  # the finding: Arrow stores 1
@example((pa.map_(pa.string(), pa.int32()), [("k", 2.25)]))
def test_a_row_is_refused_exactly_when_arrow_would_store_another_value(case: tuple[pa.DataType, Any]) -> None:
    arrow_type, value = case
    try:
        stored = pa.array([value], arrow_type).to_pylist()[0]
    except (pa.ArrowException, ValueError, TypeError, OverflowError):
        return  # refused by Arrow: the writer quarantines it as unstorable
    if isinstance(value, list) and pa.types.is_map(arrow_type):
        stored = [tuple(pair) for pair in stored]
        value = [tuple(pair) for pair in value]
    assert _fraction_into_integer(value, arrow_type) == (stored != value)


def test_the_writer_names_the_column_and_the_value() -> None:
    bad = _truncated({"qty": [1, 2.5, None, 3.0], "name": ["a", "b", "c", "d"]}, {"qty": pa.int32(),
                                                                                 "name": pa.string()})
    assert bad == {1: "column 'qty': 2.5 has a fraction, which int32 cannot hold"}
