"""Each capability a consumer may need from the metastore is declared once (``shale.metastore.api.capabilities``): no
other protocol in Shale's source restates one of its methods, except in the packages below the metastore in the
layering (which cannot import it, docs/DESIGN.md 1); and every metastore answers every capability."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from shale.metastore import IndexReads, MetastoreClient, MetastoreService
from shale.metastore.api import capabilities

SRC = Path(__file__).resolve().parents[3] / "src" / "shale"
BELOW = ("bucketindex", "compactor", "block", "index")
"""Packages the metastore imports or that sit beside it below: they declare their own protocols."""
DECLARED = {name for _, cls in inspect.getmembers(capabilities, inspect.isclass)
            if cls.__module__ == capabilities.__name__ for name in vars(cls) if not name.startswith("_")}


def restated(root: Path = SRC) -> list[str]:
    """``path:line name`` of each method of a ``Protocol`` class outside capabilities.py (and ``BELOW``) that has
    the name of a declared capability."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] in BELOW or rel == Path("metastore/api/capabilities.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef) and any(getattr(b, "id", None) == "Protocol" for b in node.bases):
                found += [f"{rel}:{f.lineno} {f.name}" for f in node.body
                          if isinstance(f, ast.FunctionDef) and f.name in DECLARED]
    return found


def test_no_consumer_restates_a_capability() -> None:
    assert {"query_blocks", "offsets", "submit", "tenants"} <= DECLARED
    assert restated() == []


def test_the_check_finds_a_restated_capability(tmp_path: Path) -> None:
    (tmp_path / "verify").mkdir()
    (tmp_path / "verify" / "x.py").write_text(
        "from typing import Protocol\n\nclass Stored(Protocol):\n    def offsets(self) -> list: ...\n")
    assert restated(tmp_path) == ["verify/x.py:4 offsets"]


def test_every_metastore_answers_every_capability() -> None:
    for cls in (IndexReads, MetastoreService, MetastoreClient):
        missing = sorted(name for name in DECLARED if not hasattr(cls, name))
        assert missing == [] or (cls is IndexReads and missing == ["submit"]), (cls.__name__, missing)
