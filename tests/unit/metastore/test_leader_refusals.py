"""The leader's side of a follower's refusals (``_RaftNode._refusals_only_go_back`` in front of pysyncobj): against
a model of pysyncobj's leader and follower, a follower with any log of older terms catches up with the leader's
within a bounded number of heartbeats; pysyncobj's own rule (a refusal sets the next index to what the follower
names) does not, whatever the follower holds beyond the last common entry."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from shale.metastore.raft.log import _RaftNode

Rule = Any  # (leader, node, message) -> message


def shale_rule(leader: SimpleNamespace, node: str, message: dict[str, Any]) -> dict[str, Any]:
    return _RaftNode._refusals_only_go_back(leader, node, message)  # type: ignore[arg-type]


def pysyncobj_rule(_leader: SimpleNamespace, _node: str, message: dict[str, Any]) -> dict[str, Any]:
    return message


def replicate(leader_log: list[int], follower_log: list[int], batch: int, rule: Rule, heartbeats: int) -> bool:
    """Whether the follower holds the leader's log after ``heartbeats`` rounds. Logs are the terms of entries 1..n
    (index 0 matches always). Each round pysyncobj's leader sends every batch from its next index for the follower
    on, moving that index past each (it assumes success); the follower answers each append in order, accepting it
    when its entry before the batch has the term the leader says (then its log is cut there and the batch
    appended), refusing it with its last index + 1 when the append starts past its end, or with the append's
    previous index when that entry's term differs; the leader applies the answers in order through ``rule``."""
    term = leader_log[-1]
    leader = SimpleNamespace(raftCurrentTerm=term, _refused={})
    follower = list(follower_log)
    next_index = len(leader_log) + 1  # a new leader's guess: the follower has everything
    for _ in range(heartbeats):
        answers = []
        index = next_index
        while True:  # a heartbeat when there is nothing to send, else every batch to the end
            entries = leader_log[index - 1:index - 1 + batch]
            prev = index - 1
            if prev > len(follower):
                answers.append({"reset": True, "success": False, "next_node_idx": len(follower) + 1})
            elif prev > 0 and follower[prev - 1] != leader_log[prev - 1]:
                answers.append({"reset": True, "success": False, "next_node_idx": prev})
            else:
                follower[prev:] = entries
                answers.append({"reset": False, "success": True, "next_node_idx": prev + len(entries) + 1})
            index += len(entries)
            if not entries or index > len(leader_log):
                break
        next_index = index
        for answer in answers:
            applied = rule(leader, "follower", answer)
            if applied["reset"]:
                next_index = applied["next_node_idx"]
        if follower == leader_log:
            return True
    return follower == leader_log


@st.composite
def logs(draw: st.DrawFn) -> tuple[list[int], list[int]]:
    """A leader's log (terms never decrease, its last entry of its own term) and a follower's: a common prefix,
    then entries of older terms the leader does not have (a leader cut off that went on appending)."""
    common = sorted(draw(st.lists(st.integers(1, 3), max_size=6)))
    own_term = (common[-1] if common else 1) + 1
    mine = [own_term] * draw(st.integers(0, 4))  # the cut-off node's entries, of a term the new leader lacks
    term = own_term + 1
    leaders = [term] * draw(st.integers(1, 8))
    return common + leaders, common + mine


@settings(max_examples=300, deadline=None)
@given(logs(), st.integers(1, 4))
@example(([1, 1, 3, 3, 3, 3], [1, 1, 2, 2]), 1)  # the long partitions profile's livelock, in small
def test_a_follower_catches_up_whatever_it_holds_beyond_the_common_entries(case: tuple[list[int], list[int]],
                                                                           batch: int) -> None:
    leader_log, follower_log = case
    # One round to learn the follower's end, one per entry to walk back, one to send the rest.
    assert replicate(leader_log, follower_log, batch, shale_rule, heartbeats=len(leader_log) + 3)


def test_pysyncobj_s_own_rule_can_go_back_and_forth_for_ever() -> None:
    # The failing case the rule exists for: refused at the conflict (back one), then past the end (forward again).
    assert not replicate([1, 1, 3, 3, 3, 3], [1, 1, 2, 2], 1, pysyncobj_rule, heartbeats=100)
    assert replicate([1, 1, 3, 3, 3, 3], [1, 1, 2, 2], 1, shale_rule, heartbeats=100)
