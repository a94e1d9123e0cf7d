"""The restore journal (issue 28): every run of ``shale restore`` recorded in the replicated state, who ran it
(set by the API from the caller's token), what, when and with what result; shown by the API and the status page."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from tests.factories import BASE_MS
from tests.unit.metastore.served import app_for, issue, served

from shale.metastore.rules.commands import Command, RecordRestore, Result, encode
from shale.metastore.rules.fsm import Entry, StateMachine
from shale.metastore.rules.restores import KEPT, restore_rows
from shale.web.page import render
from shale.web.status import Status


def record(run: str, state: str = "running", job: str = "job-a", **fields: object) -> RecordRestore:
    values: dict[str, object] = {"tenant": "acme", "topic": "billing", "target": "127.0.0.1:9092 billing",
                                 "range": "until 2026-11-20T14:02:00.000Z generation 1", "by": "ops@host"}
    return RecordRestore(run=run, job=job, state=state, **{**values, **fields})  # type: ignore[arg-type]


class Log:
    def __init__(self, path: Path) -> None:
        self.sm = StateMachine(path)
        self.index = 0
        self.now = BASE_MS

    def apply(self, command: Command) -> Result:
        self.index += 1
        self.now += 1000
        return self.sm.apply(Entry(self.index, 1, self.now), encode(command))

    def rows(self) -> list[dict[str, object]]:
        return restore_rows(self.sm.reader.conn, 10_000)


def test_a_run_is_recorded_at_its_start_and_its_end(tmp_path: Path) -> None:
    log = Log(tmp_path / "state.db")
    assert log.apply(record("a" * 16, records=500)).ok
    started = log.now
    [row] = log.rows()
    assert (row["state"], row["by"], row["records"], row["started_at"], row["ended_at"]) == (
        "running", "ops@host", 500, started, 0)
    assert log.apply(record("a" * 16, "stopped", records=300, message="partition 2: a gap")).ok
    [row] = log.rows()
    assert (row["state"], row["records"], row["message"], row["started_at"], row["ended_at"]) == (
        "stopped", 300, "partition 2: a gap", started, log.now)


def test_a_retried_record_changes_nothing_and_an_ended_run_cannot_restart(tmp_path: Path) -> None:
    log = Log(tmp_path / "state.db")
    log.apply(record("b" * 16))
    before = log.sm.reader.state_hash(with_applied=False)
    assert log.apply(record("b" * 16)).data["replay"] is True
    assert log.sm.reader.state_hash(with_applied=False) == before
    log.apply(record("b" * 16, "done", records=9))
    ended = log.sm.reader.state_hash(with_applied=False)
    assert log.apply(record("b" * 16, "done", records=9)).data["replay"] is True
    assert log.sm.reader.state_hash(with_applied=False) == ended
    refused = log.apply(record("b" * 16))
    assert (refused.ok, refused.reason) == (False, "conflict")


def test_a_new_run_of_a_job_ends_its_killed_run_as_interrupted(tmp_path: Path) -> None:
    log = Log(tmp_path / "state.db")
    log.apply(record("c" * 16))  # killed with -9: never ends
    log.apply(record("d" * 16, job="other"))
    log.apply(record("e" * 16))
    states = {r["run"]: r["state"] for r in log.rows()}
    assert states == {"c" * 16: "interrupted", "d" * 16: "running", "e" * 16: "running"}


RUNS = st.sampled_from([f"{i:016x}" for i in range(6)])
STEPS = st.lists(st.tuples(RUNS, st.sampled_from(["job-a", "job-b"]), st.sampled_from(["running", "done", "stopped"])),
                 max_size=25)


@settings(max_examples=40, deadline=None)
@given(STEPS)
def test_journal_invariants_for_any_sequence_of_records(steps: list[tuple[str, str, str]]) -> None:
    """At most one running run per job; a run's start time never changes once recorded; an accepted end is the
    row's state; every row has a start at or before its end."""
    with tempfile.TemporaryDirectory() as tmp:
        log = Log(Path(tmp) / "state.db")
        first_seen: dict[str, int] = {}
        for run, job, state in steps:
            result = log.apply(record(run, state, job=job))
            rows = {r["run"]: r for r in log.rows()}
            if result.ok:
                first_seen.setdefault(run, int(rows[run]["started_at"]))  # type: ignore[call-overload]
                if state != "running":
                    assert rows[run]["state"] == state
            for job_name in ("job-a", "job-b"):
                assert sum(1 for r in rows.values() if r["job"] == job_name and r["state"] == "running") <= 1
            for r in rows.values():
                assert r["started_at"] == first_seen[str(r["run"])]
                assert r["ended_at"] == 0 or r["ended_at"] >= r["started_at"]  # type: ignore[operator]


def test_the_journal_keeps_the_newest_runs(tmp_path: Path) -> None:
    log = Log(tmp_path / "state.db")
    for i in range(KEPT + 5):
        log.apply(record(f"{i:016x}", job=f"job-{i}"))
    rows = log.rows()
    assert len(rows) == KEPT
    assert rows[0]["run"] == f"{KEPT + 4:016x}"
    assert rows[-1]["run"] == f"{5:016x}"


def test_the_api_records_the_caller_as_who_ran_it_and_readers_of_every_tenant_see_it(tmp_path: Path) -> None:
    tokens, table = issue(tmp_path)
    app, service = app_for(tmp_path, table)
    forged = record("f" * 16, by="someone-else").model_dump_json().encode()
    with served(app) as client:
        refused = client.post("/v1/commands", content=forged,
                              headers={"authorization": f"Bearer {tokens['reader-all']}"})
        assert refused.status_code == 403
        sent = client.post("/v1/commands", content=forged, headers={"authorization": f"Bearer {tokens['admin']}"})
        assert sent.status_code == 200, sent.text
        listed = client.get("/v1/restores", headers={"authorization": f"Bearer {tokens['reader-all']}"})
        assert listed.status_code == 200
        assert [r["by"] for r in listed.json()["restores"]] == ["token admin"]
        assert client.get("/v1/restores", headers={"authorization": f"Bearer {tokens['reader-acme']}"}
                          ).status_code == 403
    assert service.restores()[0]["by"] == "token admin"


def test_the_status_page_lists_restores_with_their_result() -> None:
    status = Status(generated_at=BASE_MS / 1000, node={"role": "single"})
    status.restores = [{"run": "a" * 16, "job": "j<1>", "state": "stopped", "by": "token admin", "tenant": "acme",
                        "topic": "billing", "target": "k:9092 billing", "range": "everything backed up",
                        "records": 7, "message": "partition 2: a gap <b>", "started_at": BASE_MS,
                        "ended_at": BASE_MS + 5000}]
    html = render(status)
    table = html[html.index('<table id="restores">'):]
    table = table[:table.index("</table>")]
    assert "j&lt;1&gt;" in table
    assert "partition 2: a gap &lt;b&gt;" in table
    assert 'class="bad">stopped' in table
