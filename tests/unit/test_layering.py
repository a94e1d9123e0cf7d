"""The layering of docs/DESIGN.md section 1 is the real one: every import in src/shale (function-level imports
included) goes to the module's own package or to a package on a line above it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "shale"


def layers() -> dict[str, int]:
    """Package -> its line number in DESIGN section 1's layering block."""
    design = (ROOT / "docs" / "DESIGN.md").read_text()
    section = design[design.index("## 1. Components and layering"):design.index("## 2.")]
    block = section.split("```")[1]
    found: dict[str, int] = {}
    for rank, line in enumerate(text for text in block.splitlines() if text.strip()):
        for name in re.findall(r"shale\.(\w+)", line.split("  ")[0]):
            found[name] = rank
    return found


def package_of(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return parts[0]


def imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return {name.split(".")[1] for name in out if name.startswith("shale.")}


def test_every_package_is_in_the_documented_layering() -> None:
    documented = layers()
    present = {package_of(p) for p in SRC.rglob("*.py")} - {"__init__", "__main__"}
    assert present - set(documented) == set(), "add these packages to docs/DESIGN.md section 1"


def test_imports_only_go_down_the_documented_layers() -> None:
    documented = layers()
    wrong = []
    for path in sorted(SRC.rglob("*.py")):
        own = package_of(path)
        if own in ("__init__", "__main__"):
            continue
        for target in imports(path):
            if target != own and documented[target] >= documented[own]:
                wrong.append(f"{path.relative_to(ROOT)} imports shale.{target}")
    assert wrong == []


def test_the_layering_check_catches_an_upward_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from shale.cli import main\n")
    assert imports(module) == {"cli"}
    assert layers()["cli"] > layers()["block"]
