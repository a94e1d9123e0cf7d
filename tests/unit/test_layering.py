"""Production code never reaches into development code: only ``shale.dev`` itself, ``shale.demo`` and the
``shale dev`` command may import ``shale.dev`` (a cluster deployment has neither Maven nor a development cache).
Every import counts, those inside functions included."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
ALLOWED = ("shale.dev", "shale.demo", "shale.cli.dev_cmd")


def _module(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every module an import statement anywhere in the file names, ``from shale import dev`` as ``shale.dev``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import; Shale imports absolutely"
            base = node.module or ""
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _is_dev(name: str) -> bool:
    return name == "shale.dev" or name.startswith("shale.dev.")


def _allowed(module: str) -> bool:
    return any(module == a or module.startswith(a + ".") for a in ALLOWED)


def test_only_development_modules_import_shale_dev() -> None:
    offenders = {}
    files = sorted((SRC / "shale").rglob("*.py"))
    assert len(files) > 50  # the walk found the package
    for path in files:
        module = _module(path)
        if _allowed(module):
            continue
        dev = sorted(name for name in _imports(path) if _is_dev(name))
        if dev:
            offenders[module] = dev
    assert offenders == {}


def test_the_check_sees_function_level_and_from_imports(tmp_path: Path) -> None:
    for text in ("def f():\n    from shale.dev.fetch import x\n", "def f():\n    import shale.dev.stack\n",
                 "from shale import dev\n"):
        sample = tmp_path / "sample.py"
        sample.write_text(text)
        assert any(_is_dev(name) for name in _imports(sample)), text
    assert not _is_dev("shale.devices")
    assert not _allowed("shale.cli.dev_cmd_extra")
    assert _allowed("shale.demo.pipeline")
