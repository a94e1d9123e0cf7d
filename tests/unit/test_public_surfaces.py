"""Each component's public face is what it claims: every name in a package's ``__all__`` is importable from it,
and the package exports nothing public beyond it."""

from __future__ import annotations

import importlib
import types

import pytest

PACKAGES = ["shale.block", "shale.bucketindex", "shale.compaction", "shale.compactor", "shale.encoder", "shale.index",
            "shale.ingest", "shale.metastore", "shale.metastore.api", "shale.metastore.raft", "shale.metastore.rules",
            "shale.objstore", "shale.query", "shale.reprocess", "shale.verify"]


@pytest.mark.parametrize("name", PACKAGES)
def test_all_is_the_public_surface(name: str) -> None:
    package = importlib.import_module(name)
    declared = set(package.__all__)
    assert all(hasattr(package, n) for n in declared)
    public = {n for n, v in vars(package).items() if not n.startswith("_") and not isinstance(v, types.ModuleType)
              and n != "annotations"}
    assert public - declared == set(), f"{name} exports names missing from __all__"
