"""A follower's handling of the leader's entries (``held_entries_skipped`` in front of pysyncobj) against Raft's
rule, for any follower log and any message a leader sends."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from shale.metastore.raft.log import held_entries_skipped

Log = list[tuple[bytes, int, int]]


def pysyncobj_append(held: Log, message: dict[str, Any]) -> tuple[Log, int] | None:
    """What pysyncobj's follower does with an append: refuse it (None), or delete every entry after
    ``prevLogIdx``, append the message's entries and acknowledge the index after the last one."""
    first = held[0][1]
    prev = message["prevLogIdx"]
    if not first <= prev <= held[-1][1] or held[prev - first][2] != message["prevLogTerm"]:
        return None
    log = held[:prev - first + 1] + [tuple(e) for e in message["entries"]]
    return log, prev + len(message["entries"])


@st.composite
def follower_and_message(draw: st.DrawFn) -> tuple[Log, Log, dict[str, Any]]:
    """A leader's log, a follower's (a prefix of it, then maybe entries of older terms the leader does not
    have) and an append the leader sends: its entries from some index, or none (a heartbeat)."""
    terms = sorted(draw(st.lists(st.integers(1, 5), min_size=1, max_size=12)))
    term = draw(st.integers(terms[-1], 6))
    leader: Log = [(b"L%d" % i, i, t) for i, t in enumerate(terms, start=1)]
    kept = draw(st.integers(1, len(leader)))
    follower = leader[:kept]
    for idx in range(kept + 1, kept + 1 + draw(st.integers(0, 4))):
        low = follower[-1][2]
        leaders_term = leader[idx - 1][2] if idx <= len(leader) else None
        choices = [t for t in range(low, term) if t != leaders_term]
        if not choices:
            break
        follower.append((b"F%d" % idx, idx, draw(st.sampled_from(choices))))
    prev = draw(st.integers(1, len(leader)))
    end = draw(st.integers(prev, len(leader)))
    message = {"type": "append_entries", "term": term, "commit_index": 0, "prevLogIdx": prev,
               "prevLogTerm": leader[prev - 1][2], "entries": [list(e) for e in leader[prev:end]]}
    return leader, follower, message


@given(follower_and_message())
def test_the_follower_ends_with_the_leaders_entries_and_drops_only_what_it_must(
        case: tuple[Log, Log, dict[str, Any]]) -> None:
    leader, follower, message = case
    before = pysyncobj_append(follower, message)
    after = pysyncobj_append(follower, held_entries_skipped(follower, message))
    assert (before is None) == (after is None)  # refused exactly when pysyncobj alone refuses
    if after is None:
        return
    log, acknowledged = after
    # Everything the follower acknowledges is the leader's (a wrong acknowledgement commits a wrong entry) ...
    assert log[:acknowledged] == leader[:acknowledged]
    # ... and at least what pysyncobj alone acknowledged.
    assert acknowledged >= before[1]  # type: ignore[index]
    # An entry of the leader's current term is never deleted: the leader has it, with all before it.
    for entry in follower:
        if entry[2] == message["term"]:
            assert entry in log
    # What the follower held and the message carries stays; so does all it held when its last entry is of the
    # leader's term. (Entries of an older term past the message go, as the follower cannot tell them from a
    # conflict without the leader's entries, and pysyncobj would count them as the leader's.)
    carried = [e for e in follower if list(e) in message["entries"]]
    assert all(e in log for e in carried)
    if follower[-1][2] == message["term"]:
        assert all(e in log for e in follower)


def test_a_resent_message_and_a_heartbeat_behind_delete_nothing() -> None:
    held: Log = [(b"a", 1, 1), (b"b", 2, 2), (b"c", 3, 2), (b"d", 4, 2)]
    resent = {"type": "append_entries", "term": 2, "prevLogIdx": 1, "prevLogTerm": 1,
              "entries": [[b"b", 2, 2], [b"c", 3, 2]]}
    assert held_entries_skipped(held, resent)["prevLogIdx"] == 4
    assert held_entries_skipped(held, resent)["entries"] == []
    heartbeat = {"type": "append_entries", "term": 2, "prevLogIdx": 2, "prevLogTerm": 2, "entries": []}
    assert pysyncobj_append(held, held_entries_skipped(held, heartbeat)) == (held, 4)
    conflict = {**resent, "term": 3, "entries": [[b"b", 2, 2], [b"x", 3, 3]]}
    assert pysyncobj_append(held, held_entries_skipped(held, conflict)) == ([*held[:2], (b"x", 3, 3)], 3)
