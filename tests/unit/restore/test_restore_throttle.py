"""The restore's throttle, on a virtual clock: whatever the sends, the records and bytes sent by any moment never
exceed one second's burst plus the rate times the time elapsed, and an unlimited throttle never waits."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from shale.restore.throttle import RestoreLimits, Throttle


class VirtualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.now += seconds


sends = st.lists(st.tuples(st.integers(1, 500), st.integers(0, 100_000), st.floats(0, 0.5)), max_size=80)


@settings(max_examples=200, deadline=None)
@given(sends, st.floats(10, 10_000), st.floats(1_000, 1e7))
def test_what_is_sent_never_exceeds_the_burst_plus_the_rate(batches: list[tuple[int, int, float]],
                                                            records_per_s: float, bytes_per_s: float) -> None:
    clock = VirtualClock()
    throttle = Throttle(RestoreLimits(records_per_s, bytes_per_s), clock, clock.sleep)
    records = nbytes = 0
    for count, size, pause in batches:
        clock.now += pause  # the sender's own work between sends
        throttle.take(count, size)
        records, nbytes = records + count, nbytes + size
        # Once take returns, what was sent so far fits the limits (a send larger than the burst waits its debt).
        assert records <= records_per_s * (1 + clock.now) + 1e-6 * records
        assert nbytes <= bytes_per_s * (1 + clock.now) + 1e-6 * max(nbytes, 1)


@given(sends)
def test_no_limit_never_waits(batches: list[tuple[int, int, float]]) -> None:
    clock = VirtualClock()
    throttle = Throttle(RestoreLimits(), clock, clock.sleep)
    assert all(throttle.take(count, size) == 0 for count, size, _ in batches)
    assert clock.now == 0


def test_a_steady_sender_settles_at_the_rate() -> None:
    clock = VirtualClock()
    throttle = Throttle(RestoreLimits(records_per_s=1000), clock, clock.sleep)
    for _ in range(100):
        throttle.take(100, 0)  # 10,000 records: the first 1,000 are the burst, the other 9,000 take 9 s
    assert 8.99 < clock.now < 9.01


def test_the_job_s_limits_are_shared_by_its_running_tasks() -> None:
    limits = RestoreLimits(records_per_s=900, bytes_per_s=None)
    assert limits.share(3) == RestoreLimits(300, None)
    assert limits.share(0) == limits
    assert not RestoreLimits().limited
    assert limits.limited
