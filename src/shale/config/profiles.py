"""Profiles: one setting (``profile = "trial"``) that stands for several, for what a single key cannot say.

The trial profile shortens the delays that keep an object a reader may still be reading: on defaults a replaced
block's objects stay ``block.delete_delay`` (2 h), so an erasure's receipt, which is written only once they are
gone, comes about two hours after the erasure. The delete delay may not be shorter than
``bucket_index.max_stale_period`` (a reader may list blocks from an index that old) or ``block.sync_delay`` (a
bucket scanner trusts no younger block), and an index must be rewritten within the stale period or its readers
refuse it, so a trial in minutes needs all four lowered together: the profile does that, and a key set explicitly
(in the file, the environment or ``--set``) keeps its value. It is for one machine trying Shale out; in production
these delays are what keeps a slow reader from finding a block's objects gone under it.
"""

from __future__ import annotations

from typing import Any

PROFILES: dict[str, dict[str, dict[str, str]]] = {
    "default": {},
    "trial": {
        "block": {"sync_delay": "30s", "delete_delay": "1m"},
        "bucket_index": {"max_stale_period": "1m", "rewrite_interval": "30s"},
    },
}
"""Each profile's values, by section and key, as written in shale.toml."""


def apply_profile(tree: Any) -> Any:
    """``tree`` (a configuration as read, before validation) with its profile's values for the keys it does not
    set; anything else (an unknown profile, sections given as models) is left for validation to judge."""
    if not isinstance(tree, dict):
        return tree
    values = PROFILES.get(tree.get("profile", "default"))
    if not values:
        return tree
    out = dict(tree)
    for section, keys in values.items():
        given = out.get(section, {})
        if isinstance(given, dict):
            out[section] = {**keys, **given}
    return out


def describe(name: str) -> str:
    """A profile's values in one line: ``block.sync_delay 30s, ...``."""
    return ", ".join(f"{section}.{key} {value}" for section, keys in PROFILES[name].items()
                     for key, value in keys.items())
