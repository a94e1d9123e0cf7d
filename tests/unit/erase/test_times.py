"""Times for people and receipts: ISO 8601 UTC to the millisecond, read back to the same epoch milliseconds."""

from __future__ import annotations

import datetime as dt

from hypothesis import example, given
from hypothesis import strategies as st

from shale.erase.times import iso_ms


@given(ms=st.integers(min_value=1, max_value=253_402_300_799_999))  # to 9999-12-31T23:59:59.999Z
@example(ms=1_795_000_000_000)
@example(ms=9_432_133_347_317)  # a float of seconds rounded it to ...347.316Z
def test_an_iso_time_reads_back_to_its_milliseconds(ms: int) -> None:
    text = iso_ms(ms)
    assert text.endswith("Z")
    parsed = dt.datetime.fromisoformat(text.removesuffix("Z") + "+00:00")
    assert parsed - dt.datetime(1970, 1, 1, tzinfo=dt.UTC) == dt.timedelta(milliseconds=ms)


def test_no_time_is_empty() -> None:
    assert iso_ms(0) == iso_ms(None) == ""
    assert iso_ms(1_795_000_000_123) == "2026-11-18T11:06:40.123Z"
