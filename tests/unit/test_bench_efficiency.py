"""The efficiency benchmark's CPU accounting: a process tree's CPU seconds, children that exited included, other
processes' not."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from bench.efficiency_cpu import Snapshot, members, parse_stat, sampled, snapshot, used
from bench.efficiency_profile import Profile, summarize
from bench.efficiency_shale import kind_of
from hypothesis import given
from hypothesis import strategies as st

BURN = "import sys, time\nt = time.process_time()\nwhile time.process_time() - t < float(sys.argv[1]): pass\n"
"""A process that burns the CPU seconds it is given, by its own clock."""


@st.composite
def forests(draw: st.DrawFn) -> tuple[dict[int, int], list[int], list[int]]:
    """A process table (pid -> parent; parents drawn among earlier pids or absent ones, as init is), roots and
    excluded pids drawn from it."""
    size = draw(st.integers(1, 30))
    parents = {pid: draw(st.sampled_from([0, *range(1, pid)])) for pid in range(1, size + 1)}
    pids = st.sampled_from(sorted(parents))
    return parents, draw(st.lists(pids, max_size=4)), draw(st.lists(pids, max_size=3))


@given(forests())
def test_a_tree_is_its_roots_and_every_descendant_not_under_an_excluded_pid(
        forest: tuple[dict[int, int], list[int], list[int]]) -> None:
    parents, roots, exclude = forest

    def path(pid: int) -> list[int]:  # the pid and its ancestors
        out = [pid]
        while parents.get(out[-1], 0) in parents:
            out.append(parents[out[-1]])
        return out

    expected = set()
    for pid in parents:
        chain = path(pid)
        for i, ancestor in enumerate(chain):
            if ancestor in roots:
                if not set(chain[: i + 1]) & set(exclude):
                    expected.add(pid)
                break
            if ancestor in exclude:
                break
    assert members(parents, roots, exclude) == expected


def test_stat_fields_are_read_after_a_command_name_with_spaces_and_parentheses() -> None:
    fields = ["S", "7", *["0"] * 9, "250", "50", "30", "20", *["0"] * 30]
    text = "42 (java (x) y) " + " ".join(fields)
    assert parse_stat(text, 100) == (7, 3.0, 0.5)


def test_a_tree_counts_a_child_that_came_and_went_and_not_a_process_outside_it() -> None:
    """The root waits for a line, then runs a child that burns 0.4 CPU seconds and exits (waited for), burns
    0.3 s itself and stays alive; a process beside it, not in its tree, burns 1 s in the same window."""
    root_code = "import subprocess\n" + BURN + textwrap.dedent(f"""
        sys.stdin.readline()
        subprocess.run([sys.executable, "-c", {BURN!r}, "0.4"], check=True)
        t = time.process_time()
        while time.process_time() - t < 0.3: pass
        print("done", flush=True)
        sys.stdin.readline()
    """)
    root = subprocess.Popen([sys.executable, "-c", root_code, "0"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    assert root.stdin is not None
    assert root.stdout is not None
    try:
        before: Snapshot = snapshot()
        beside = subprocess.Popen([sys.executable, "-c", BURN, "1.0"])
        root.stdin.write("go\n")
        root.stdin.flush()
        assert root.stdout.readline() == "done\n"
        beside.wait(60)
        after = snapshot()
        cpu = used(before, after, [root.pid])
        # 0.7 s burnt in the tree (clock ticks round each process's figure), plus the child's interpreter start;
        # the 1 s beside it is not counted.
        assert 0.65 <= cpu < 1.6
        assert used(before, after, [root.pid], exclude=[root.pid]) == 0
    finally:
        root.kill()
        root.wait(10)


def test_a_profile_adds_up_a_function_over_lines_and_processes_and_keeps_command_lines_whole() -> None:
    raw = (
        'process 11:"python -c \nimport x; y";<module> (<string>:1);parse (shale/encoder/records.py:10);'
        "loads (json/__init__.py:346) 6\n"
        'process 12:"python -m pyspark.daemon";main (pyspark/daemon.py:3);parse (shale/encoder/records.py:12) 3\n'
        'process 12:"python -m pyspark.daemon";main (pyspark/daemon.py:3) 1\n'
    )
    profile = summarize(raw)
    assert profile.samples == 10
    assert profile.self_share == [("loads (json/__init__.py)", 0.6), ("parse (encoder/records.py)", 0.3),
                                  ("main (pyspark/daemon.py)", 0.1)]
    assert dict(profile.inclusive_share)["parse (encoder/records.py)"] == 0.9
    assert summarize("") == Profile(0, [], [])


@pytest.mark.parametrize(("command", "kind"), [
    ("/usr/lib/jvm/bin/java -cp x org.apache.spark.deploy.SparkSubmit", "jvm"),
    ("/work/main/.venv/bin/python -m shale.spark_daemon pyspark.worker", "python_workers"),
    ("/work/main/.venv/bin/python -m shale.cli --config f ingest", "drivers"),
])
def test_each_process_of_a_deployment_has_a_kind(command: str, kind: str) -> None:
    assert kind_of(command) == kind


@given(size=st.integers(100, 4096), count=st.integers(1, 40))
def test_log_records_fill_their_size_with_loghub_text(size: int, count: int) -> None:
    from bench.efficiency import json_value, log_records

    records = list(log_records(size, count))
    assert len(records) == count
    for record in records:
        value = json_value(record)
        assert size - 20 <= len(value) <= size
        assert record["msg"]
        assert record["level"] in ("ERROR", "WARN", "INFO", "DEBUG", "FATAL")


def test_a_window_counts_a_child_the_kernel_reaped_for_a_parent_ignoring_sigchld() -> None:
    """PySpark's daemon ignores SIGCHLD: a worker that exits is reaped by the kernel and its time is added to no
    parent. The root here does the same with a child that burns 0.6 CPU seconds and exits inside the window."""
    code = textwrap.dedent("""
        import os, signal, sys, time
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)
        sys.stdin.readline()
        pid = os.fork()
        if pid == 0:
            t = time.process_time()
            while time.process_time() - t < 0.6: pass
            os._exit(0)
        while True:
            try:
                os.kill(pid, 0)
                time.sleep(0.05)
            except ProcessLookupError:
                break
        print("done", flush=True)
        sys.stdin.readline()
    """)
    root = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert root.stdin is not None
    assert root.stdout is not None
    try:
        with sampled(0.1) as window:
            root.stdin.write("go\n")
            root.stdin.flush()
            assert root.stdout.readline() == "done\n"
        assert window.after is not None
        assert used(window.before, window.after, [root.pid]) < 0.3  # the child's time went nowhere
        assert 0.45 <= window.total([root.pid]) < 1.2  # all but its last sample interval (0.1 s), and ticks
        by_kind = window.used([root.pid], key=lambda p: "python" if "python" in p.command else "other")
        assert set(by_kind) <= {"python", "other"}
        assert by_kind.get("python", 0.0) >= 0.45
    finally:
        root.kill()
        root.wait(10)
