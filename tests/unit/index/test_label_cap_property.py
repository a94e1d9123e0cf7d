"""Properties of pruning past the label-set cap (issue 26 case 2): whatever the label sets, the capped list a
block keeps never prunes a dataset that one of its rows' label sets matches, and it never grows past the cap."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shale.block.names import MORE_LABEL_SETS, cap_label_sets
from shale.index import Matcher, match_label_sets

NAMES = st.sampled_from(["topic", "host", "level", "dt"])
VALUES = st.sampled_from(["", "a", "b", "h1", "h2", "x\ny", "ü"])
LABEL_SETS = st.lists(st.dictionaries(NAMES, VALUES, min_size=1, max_size=4), min_size=1, max_size=40)
MATCHERS = st.lists(st.builds(Matcher.of, NAMES, st.sampled_from(["=", "!=", "=~", "!~"]),
                              st.sampled_from(["a", "", "h.", ".*", "x.y", "b|ü"])), max_size=3)


@given(sets=LABEL_SETS, limit=st.integers(1, 12), matchers=MATCHERS)
def test_capped_label_sets_never_prune_a_match(sets: list[dict[str, str]], limit: int,
                                               matchers: list[Matcher]) -> None:
    capped = cap_label_sets(sets, limit)
    assert len(capped) <= limit
    if match_label_sets(sets, matchers):
        assert match_label_sets(capped, matchers)
    if len(sets) <= limit:
        assert capped == sets
    else:
        assert MORE_LABEL_SETS in capped[-1]
        assert all(MORE_LABEL_SETS not in ls for ls in capped[:-1])


@given(sets=LABEL_SETS, limit=st.integers(2, 12), more_limit=st.integers(1, 12), matchers=MATCHERS)
def test_capping_twice_never_prunes_a_match(sets: list[dict[str, str]], limit: int, more_limit: int,
                                            matchers: list[Matcher]) -> None:
    """A compaction merges capped lists (with their "more" sets) and caps again."""
    twice = cap_label_sets([*cap_label_sets(sets, limit), *cap_label_sets(list(reversed(sets)), more_limit)], limit)
    if match_label_sets(sets, matchers):
        assert match_label_sets(twice, matchers)
