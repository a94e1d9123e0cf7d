"""What a restore's progress line says, from the plan and the committed progress: records restored of those
planned (never more than planned, even past an --until bound), the rate of this run only (a resumed job's earlier
records do not count), and an ETA that is 0 exactly when everything planned is restored."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shale.restore.progress import progress_line

partitions = st.dictionaries(st.integers(0, 7), st.integers(0, 10_000), max_size=8)


@given(partitions, st.data(), st.floats(0.001, 1000))
def test_restored_never_exceeds_the_plan_and_the_eta_is_zero_only_when_done(
        planned: dict[int, int], data: st.DataObject, elapsed: float) -> None:
    first = {p: (0, data.draw(st.integers(0, n))) for p, n in planned.items()}
    now = {p: (0, first[p][1] + data.draw(st.integers(0, 2 * n))) for p, n in planned.items()}
    line = progress_line(planned, first, now, elapsed)
    assert 0 <= line.restored <= line.planned == sum(planned.values())
    assert (line.eta_seconds == 0) == (line.restored == line.planned)
    assert line.per_second >= 0


def test_a_resumed_run_counts_only_its_own_records_in_the_rate() -> None:
    line = progress_line({0: 1000, 1: 1000}, {0: (500, 500)}, {0: (700, 700), 1: (100, 100)}, elapsed=10)
    assert (line.restored, line.planned, line.per_second) == (800, 2000, 30.0)
    assert line.eta_seconds == 40.0
    assert line.text("job1") == "restore job1: 800/2,000 records (40%), 30 records/s, ETA 0m40s"


def test_no_progress_yet_has_no_eta() -> None:
    line = progress_line({0: 10}, {}, {}, elapsed=3)
    assert line.eta_seconds is None
    assert "ETA unknown" in line.text("j")
