"""Ingest leases in the state machine: acquire, renew, release, takeover by a standby, and the fencing of every
commit by the lease's token (issue 30)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import example, given, settings
from hypothesis import strategies as st
from tests.factories import BASE_MS
from tests.unit.metastore.helpers import meta

from shale.metastore.rules.commands import (
    AcquireIngestLease,
    Command,
    CommitIngestBatch,
    Noop,
    OffsetRange,
    ReleaseIngestLease,
    RenewIngestLease,
    Result,
    encode,
)
from shale.metastore.rules.fsm import Entry, StateMachine

SECOND = 1000
DURATION = 10 * SECOND


class Log:
    """A state machine fed by a log whose entries carry an explicit leader time."""

    def __init__(self, path: Path) -> None:
        self.sm = StateMachine(path)
        self.index = 0
        self.now = BASE_MS
        self.end = 0  # the committed end of backup app[0]

    def apply(self, command: Command) -> Result:
        self.index += 1
        return self.sm.apply(Entry(self.index, 1, self.now), encode(command))

    def run(self, ms: int) -> None:
        """Let ``ms`` of log time pass with the log running (other traffic: an entry every tenth of a lease), as
        opposed to ``now +=``, a silence (the metastore unreachable)."""
        end = self.now + ms
        while self.now < end:
            self.now = min(end, self.now + DURATION // 10)
            self.apply(Noop())

    def acquire(self, holder: str, duration: int = DURATION) -> Result:
        return self.apply(AcquireIngestLease(group="backup", holder=holder, duration_ms=duration))

    def commit(self, token: int | None, count: int = 10) -> Result:
        block = meta(start=self.end, end=self.end + count, key=f"b/{self.index}")
        result = self.apply(CommitIngestBatch(group="backup", lease=token, blocks=[block], ranges=[
            OffsetRange(topic="app", partition=0, start=self.end, end=self.end + count)]))
        if result.ok:
            self.end += count
        return result


def _log(tmp_path: Path) -> Log:
    return Log(tmp_path / "state.db")


def test_the_first_driver_gets_the_lease_and_its_token_is_the_log_index(tmp_path: Path) -> None:
    log = _log(tmp_path)
    log.commit(None)  # any entry before: the token is an index, not a counter
    first = log.acquire("a").data
    assert first["granted"]
    assert first["token"] == 2
    assert first["holder"] == "a"
    assert first["expires_at"] == BASE_MS + DURATION


def test_a_standby_waits_while_the_lease_is_held_and_takes_over_when_it_expires(tmp_path: Path) -> None:
    log = _log(tmp_path)
    token_a = log.acquire("a").data["token"]
    log.run(DURATION - 1)
    waiting = log.acquire("b").data
    assert not waiting["granted"]
    assert waiting["holder"] == "a"
    assert waiting["token"] == token_a
    log.run(1)
    taken = log.acquire("b").data
    assert taken["granted"]
    assert taken["holder"] == "b"
    assert taken["token"] > token_a
    assert taken["takeovers"] == 1


def test_the_holder_asking_again_keeps_its_token_and_extends_it(tmp_path: Path) -> None:
    log = _log(tmp_path)
    token = log.acquire("a").data["token"]
    log.now += 5 * SECOND
    again = log.acquire("a").data
    assert again["granted"]
    assert again["token"] == token
    assert again["expires_at"] == log.now + DURATION


def test_a_commit_with_a_stale_token_is_refused_after_a_takeover(tmp_path: Path) -> None:
    log = _log(tmp_path)
    old = log.acquire("a").data["token"]
    assert log.commit(old).ok
    log.run(DURATION)
    new = log.acquire("b").data["token"]
    zombie = log.commit(old)
    assert not zombie.ok
    assert zombie.reason == "stale-lease"
    assert log.commit(new).ok
    assert log.end == 20


def test_case12_a_lease_that_expired_with_nobody_taking_over_still_commits_and_renews(tmp_path: Path) -> None:
    """A metastore outage longer than the lease: the driver's commit (dead-lettered meanwhile, replayed after) and
    its heartbeat come in past the expiry by the log's time, and nobody took the shard: both are accepted and renew
    the lease, so a standby asking afterwards waits again."""
    log = _log(tmp_path)
    token = log.acquire("a").data["token"]
    log.now += 4 * DURATION  # the outage: no entry at all
    late = log.commit(token)
    assert late.ok, late
    renewed = log.apply(RenewIngestLease(group="backup", holder="a", token=token, duration_ms=DURATION))
    assert renewed.ok, renewed
    assert renewed.data["expires_at"] == log.now + DURATION
    assert not log.acquire("b").data["granted"]
    log.now += 2 * DURATION
    again = log.acquire("a").data  # the holder asking again after an expiry nobody took: the same lease
    assert (again["granted"], again["token"]) == (True, token)
    assert log.commit(token).ok
    assert log.end == 20


def test_case12_a_standby_asking_first_after_an_outage_does_not_take_the_shard(tmp_path: Path) -> None:
    """The outage is a silence in the log: it does not count against the holder's lease, so the standby that gets
    through first when the metastore returns waits, and the holder's queued commits and heartbeats come in. A
    standby still takes over a holder that stays silent for a lease while the log runs."""
    log = _log(tmp_path)
    token = log.acquire("a").data["token"]
    log.run(4 * SECOND)
    log.now += 60 * SECOND  # the outage
    waiting = log.acquire("b").data
    assert not waiting["granted"]
    assert waiting["expires_at"] == log.now + DURATION - 4 * SECOND
    assert log.commit(token).ok
    log.run(DURATION - 1)
    assert not log.acquire("b").data["granted"]
    log.run(1)
    taken = log.acquire("b").data
    assert taken["granted"]
    assert log.commit(token).reason == "stale-lease"


def test_case12_a_paused_driver_is_fenced_once_another_driver_took_its_shard(tmp_path: Path) -> None:
    log = _log(tmp_path)
    token = log.acquire("a").data["token"]
    log.run(DURATION)  # the holder paused while the log ran
    taken = log.acquire("b").data
    assert taken["granted"]
    assert log.commit(token).reason == "stale-lease"
    assert log.apply(RenewIngestLease(group="backup", holder="a", token=token, duration_ms=DURATION)).reason == \
        "stale-lease"
    assert log.commit(taken["token"]).ok


def test_case12_a_released_lease_takes_its_holders_commit_but_stays_released(tmp_path: Path) -> None:
    """A commit the holder dead-lettered before it released the lease on a clean stop is its work (nobody wrote
    since); it is accepted without taking the lease back, and the holder's renewal is refused."""
    log = _log(tmp_path)
    token = log.acquire("a").data["token"]
    assert log.apply(ReleaseIngestLease(group="backup", holder="a", token=token)).data["released"]
    assert log.commit(token).ok
    refused = log.apply(RenewIngestLease(group="backup", holder="a", token=token, duration_ms=DURATION))
    assert refused.reason == "lease-expired"
    taken = log.acquire("b").data
    assert taken["granted"]
    assert taken["token"] > token
    assert log.commit(token).reason == "stale-lease"


def test_commits_and_heartbeats_renew_the_lease(tmp_path: Path) -> None:
    log = _log(tmp_path)
    token = log.acquire("a").data["token"]
    for _ in range(3):  # three lease durations, each renewed within it
        log.now += DURATION - 1
        assert log.commit(token).ok
    for _ in range(3):
        log.now += DURATION - 1
        assert log.apply(RenewIngestLease(group="backup", holder="a", token=token, duration_ms=DURATION)).ok
    assert not log.acquire("b").data["granted"]


def test_a_leased_shard_refuses_a_commit_without_a_token_and_an_unleased_one_a_token(tmp_path: Path) -> None:
    log = _log(tmp_path)
    assert log.commit(None).ok  # never leased: writers that do not lease (reprocess, older callers)
    assert log.commit(7).reason == "no-lease"
    token = log.acquire("a").data["token"]
    assert log.commit(None).reason == "lease-required"
    assert log.apply(ReleaseIngestLease(group="backup", holder="a", token=token)).data["released"]
    assert log.commit(None).reason == "lease-required"  # released, still leased once: tokens stay required


def test_a_release_lets_a_standby_in_at_once_without_counting_a_takeover(tmp_path: Path) -> None:
    log = _log(tmp_path)
    token = log.acquire("a").data["token"]
    assert log.apply(ReleaseIngestLease(group="backup", holder="a", token=token)).data["released"]
    taken = log.acquire("b").data
    assert taken["granted"]
    assert taken["takeovers"] == 0
    stale = log.apply(ReleaseIngestLease(group="backup", holder="a", token=token))
    assert stale.ok
    assert not stale.data["released"]
    assert log.commit(taken["token"]).ok


def test_an_exact_replay_of_a_committed_batch_answers_as_applied_whatever_its_token(tmp_path: Path) -> None:
    """A driver retrying a commit whose answer it lost learns that it was applied, even if the lease moved
    since: a replay changes nothing, so it needs no lease."""
    log = _log(tmp_path)
    token = log.acquire("a").data["token"]
    block = meta(start=0, end=10, key="once")
    command = CommitIngestBatch(group="backup", lease=token, blocks=[block], ranges=[
        OffsetRange(topic="app", partition=0, start=0, end=10)])
    assert log.apply(command).data["replay"] is False
    log.run(DURATION)
    log.acquire("b")
    assert log.apply(command).data["replay"] is True


def test_leases_are_per_group_generation_and_shard(tmp_path: Path) -> None:
    log = _log(tmp_path)
    log.apply(AcquireIngestLease(group="backup", holder="a", duration_ms=DURATION, shards=2))
    other = [log.apply(AcquireIngestLease(group=g, generation=n, shard=s, holder="b", duration_ms=DURATION))
             for g, n, s in (("partition", 1, 0), ("backup", 2, 0), ("backup", 1, 1))]
    assert all(r.data["granted"] for r in other)


OPS = st.lists(st.tuples(st.sampled_from(["acquire", "renew", "release", "commit", "tick", "noop"]),
                         st.sampled_from(["a", "b", "c"]), st.integers(0, 2 * DURATION)), max_size=40)


@settings(max_examples=80, deadline=None)
@given(ops=OPS)
@example(ops=[("acquire", "a", 0), ("tick", "a", 2 * DURATION), ("commit", "a", 0), ("renew", "a", 0)])
@example(ops=[("acquire", "a", 0), ("tick", "a", DURATION), ("acquire", "b", 0), ("commit", "a", 0)])
def test_case12_a_commit_is_accepted_iff_nobody_took_the_lease_since_its_token(
        ops: list[tuple[str, str, int]]) -> None:
    """Over lease timelines of one shard (acquires, renewals, releases, commits, other traffic, and log time
    passing with or without entries, outages included): a commit is accepted exactly when no grant came after its
    token's (the token is still the shard's, whatever the log's time); a renewal likewise unless the lease was
    released; expiry only decides when another driver may be granted, and a silence in the log longer than a
    heartbeat period does not count towards it; commits and renewals renew; every new grant's token is larger
    than all before it."""
    with tempfile.TemporaryDirectory() as scratch:
        log = Log(Path(scratch) / "state.db")
        grants: list[int] = []  # every token granted, in order: a token fences nothing while it is the last
        holder, expires, duration = "", 0, DURATION
        tokens: dict[str, int] = {}  # what each driver believes its token is
        last = 0  # the log time of the last entry
        for op, who, dt in ops:
            if op == "tick":  # time passes without an entry: a silence (an outage when long)
                log.now += dt
                continue
            current = grants[-1] if grants else None
            mine = tokens.get(who)
            if op in ("renew", "release") and mine is None:
                continue
            gap = log.now - last
            if last and holder and expires > last and 3 * gap > duration:
                expires += gap  # a silence longer than a heartbeat period does not count against the lease
            last = max(last, log.now)
            if op == "noop":  # other traffic: the log runs
                assert log.apply(Noop()).ok
            elif op == "acquire":
                result = log.acquire(who)
                grant = expires <= log.now or holder == who
                assert result.data["granted"] == grant, (result, holder, expires, log.now)
                if grant:
                    same = holder == who and current is not None
                    token = current if same else log.index
                    assert result.data["token"] == token
                    if not same:
                        assert all(token > t for t in grants)
                        grants.append(token)
                    holder, expires, tokens[who] = who, log.now + duration, token
            elif op == "renew" and mine is not None:
                result = log.apply(RenewIngestLease(group="backup", holder=who, token=mine, duration_ms=duration))
                assert result.ok == (mine == current and holder != ""), (result, mine, grants, holder)
                if result.ok:
                    expires = log.now + duration
            elif op == "release" and mine is not None:
                result = log.apply(ReleaseIngestLease(group="backup", holder=who, token=mine))
                assert result.data["released"] == (mine == current and holder != "")
                if result.data["released"]:
                    expires, holder = log.now, ""
            elif op == "commit":
                result = log.commit(mine)
                assert result.ok == (mine == current), (result, mine, grants)
                if result.ok and holder:
                    expires = log.now + duration
        log.sm.close()


def test_case12_lease_commands_applied_twice_are_applied_once(tmp_path: Path) -> None:
    """Past an expiry nobody took over, each lease command and a commit applied twice (as two log entries at the
    same log time) leave the state as applied once."""
    def timeline(path: Path, twice: bool) -> str:
        log = Log(path)
        token = log.acquire("a").data["token"]
        log.now += 3 * DURATION
        block = meta(start=0, end=10, key="late")
        commands: list[Command] = [
            CommitIngestBatch(group="backup", lease=token, blocks=[block], ranges=[
                OffsetRange(topic="app", partition=0, start=0, end=10)]),
            RenewIngestLease(group="backup", holder="a", token=token, duration_ms=DURATION),
            AcquireIngestLease(group="backup", holder="a", duration_ms=DURATION),
            ReleaseIngestLease(group="backup", holder="a", token=token)]
        for command in commands:
            for _ in range(2 if twice else 1):
                assert log.apply(command).ok
        state = log.sm.reader.state_hash(with_applied=False)
        log.sm.close()
        return state

    assert timeline(tmp_path / "once.db", False) == timeline(tmp_path / "twice.db", True)


def test_an_ingest_token_of_the_group_may_send_its_lease_commands() -> None:
    from shale.metastore.api import auth

    for kind in ("AcquireIngestLease", "RenewIngestLease", "ReleaseIngestLease", "CommitIngestBatch"):
        assert auth.command_need(kind, "backup") == auth.ingest("backup")
    assert auth.command_need("AcquireIngestLease", None) == auth.ADMIN
