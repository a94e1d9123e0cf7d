"""Ingest leases in the state machine: acquire, renew, release, takeover by a standby, and the fencing of every
commit by the lease's token (issue 30)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from tests.factories import BASE_MS
from tests.unit.metastore.helpers import meta

from shale.metastore.commands import (
    AcquireIngestLease,
    Command,
    CommitIngestBatch,
    OffsetRange,
    ReleaseIngestLease,
    RenewIngestLease,
    Result,
    encode,
)
from shale.metastore.fsm import Entry, StateMachine

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
    log.now += DURATION - 1
    waiting = log.acquire("b").data
    assert not waiting["granted"]
    assert waiting["holder"] == "a"
    assert waiting["token"] == token_a
    log.now += 1
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
    log.now += DURATION
    new = log.acquire("b").data["token"]
    zombie = log.commit(old)
    assert not zombie.ok
    assert zombie.reason == "stale-lease"
    assert log.commit(new).ok
    assert log.end == 20


def test_a_paused_driver_past_its_lease_cannot_commit_even_if_nobody_took_over(tmp_path: Path) -> None:
    log = _log(tmp_path)
    token = log.acquire("a").data["token"]
    log.now += DURATION
    late = log.commit(token)
    assert not late.ok
    assert late.reason == "lease-expired"
    refused = log.apply(RenewIngestLease(group="backup", holder="a", token=token, duration_ms=DURATION))
    assert not refused.ok
    assert refused.reason == "lease-expired"
    again = log.acquire("a").data
    assert again["granted"]
    assert again["token"] > token
    assert log.commit(again["token"]).ok
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
    log.now += DURATION
    log.acquire("b")
    assert log.apply(command).data["replay"] is True


def test_leases_are_per_group_generation_and_shard(tmp_path: Path) -> None:
    log = _log(tmp_path)
    log.apply(AcquireIngestLease(group="backup", holder="a", duration_ms=DURATION, shards=2))
    other = [log.apply(AcquireIngestLease(group=g, generation=n, shard=s, holder="b", duration_ms=DURATION))
             for g, n, s in (("partition", 1, 0), ("backup", 2, 0), ("backup", 1, 1))]
    assert all(r.data["granted"] for r in other)


OPS = st.lists(st.tuples(st.sampled_from(["acquire", "renew", "release", "commit", "tick"]),
                         st.sampled_from(["a", "b", "c"]), st.integers(0, 2 * DURATION)), max_size=40)


@settings(max_examples=60, deadline=None)
@given(ops=OPS)
def test_only_the_newest_unexpired_lease_commits_and_tokens_grow(ops: list[tuple[str, str, int]]) -> None:
    """Against a reference model of one shard: a commit (and a renewal) is accepted exactly when its token is the
    shard's newest and that lease has not expired by the entry's log time; commits renew; every granted token is
    larger than every token granted before it to another holder; one holder at a time."""
    with tempfile.TemporaryDirectory() as scratch:
        log = Log(Path(scratch) / "state.db")
        holder, token, expires, duration = "", 0, 0, DURATION
        tokens: dict[str, int] = {}  # what each driver believes its token is
        granted: list[int] = []
        for op, who, dt in ops:
            if op == "tick":
                log.now += dt
                continue
            live = expires > log.now
            mine = tokens.get(who)
            if op == "acquire":
                result = log.acquire(who)
                grant = not live or holder == who
                assert result.data["granted"] == grant
                if grant:
                    new = token if live and holder == who else log.index
                    assert result.data["token"] == new
                    assert all(new > t for t in granted if t != new)
                    granted.append(new)
                    holder, token, expires, tokens[who] = who, new, log.now + duration, new
            elif op == "renew" and mine is not None:
                result = log.apply(RenewIngestLease(group="backup", holder=who, token=mine, duration_ms=duration))
                assert result.ok == (mine == token and live), (result, mine, token, live)
                if result.ok:
                    expires = log.now + duration
            elif op == "release" and mine is not None:
                result = log.apply(ReleaseIngestLease(group="backup", holder=who, token=mine))
                assert result.data["released"] == (mine == token and live)
                if result.data["released"]:
                    expires, holder = log.now, ""
            elif op == "commit":
                result = log.commit(mine)
                if not granted:
                    assert result.ok == (mine is None)
                else:
                    assert result.ok == (mine == token and live), (result, mine, token, live)
                    if result.ok:
                        expires = log.now + duration
        log.sm.close()


def test_an_ingest_token_of_the_group_may_send_its_lease_commands() -> None:
    from shale.metastore import auth

    for kind in ("AcquireIngestLease", "RenewIngestLease", "ReleaseIngestLease", "CommitIngestBatch"):
        assert auth.command_need(kind, "backup") == auth.ingest("backup")
    assert auth.command_need("AcquireIngestLease", None) == auth.ADMIN
