"""The layering of docs/DESIGN.md section 1 is the real one: every import in src/shale (function-level imports
included) goes to the module's own package or to a package on a line above it, and inside a package split into
parts (``shale.metastore.rules``, ``raft``, ``api``, one line each) to the module's own part or a part above it,
through that part's face; and production code never reaches into development code: only ``shale.dev`` itself,
``shale.demo`` and the ``shale dev`` command may import ``shale.dev`` (a cluster deployment has neither Maven nor
a development cache)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "shale"


def _layering_block() -> list[str]:
    """The names column of each line of DESIGN section 1's layering block, lowest layer first."""
    design = (ROOT / "docs" / "DESIGN.md").read_text()
    section = design[design.index("## 1. Components and layering"):design.index("## 2.")]
    block = section.split("```")[1]
    return [text.split("  ")[0] for text in block.splitlines() if text.strip()]


def layers() -> dict[str, int]:
    """Package -> its line number in DESIGN section 1's layering block (the last of a package split into parts)."""
    found: dict[str, int] = {}
    for rank, names in enumerate(_layering_block()):
        for name in re.findall(r"shale\.(\w+)", names):
            found[name] = rank
    return found


def parts() -> dict[str, int]:
    """Part of a package (``metastore.rules``) -> its line number in the layering block: a package split into
    parts has a line for each part, lowest first."""
    found: dict[str, int] = {}
    for rank, names in enumerate(_layering_block()):
        for package, part in re.findall(r"shale\.(\w+)\.(\w+)", names):
            found[f"{package}.{part}"] = rank
    return found


def part_of(path: Path) -> str | None:
    """``metastore.rules`` for a module of that part; None for a module of a package without parts, or for the
    package's own face."""
    names = path.relative_to(SRC).with_suffix("").parts
    return f"{names[0]}.{names[1]}" if len(names) > 2 and f"{names[0]}.{names[1]}" in parts() else None


def package_of(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return parts[0]


def imports(path: Path) -> set[str]:
    """The Shale packages the file imports (``from shale import errors`` counts as ``errors``)."""
    return {name.split(".")[1] for name in _imports(path) if name.startswith("shale.")}


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


# Modules another package imports as a namespace, not through the face, and why. Nothing else below a face.
_FORMAT = "the formats share their verbs (arrow_type, Decoder, fingerprint): a parser names its format"
_STORE = "a table family's store: the metastore's command rules call its reads and writes as store.verb"
NAMESPACES = {
    "shale.schemas.avro": _FORMAT,
    "shale.schemas.jsonschema": _FORMAT,
    "shale.schemas.protobuf": _FORMAT,
    "shale.index.erasures": _STORE,
    "shale.index.generations": _STORE,
    "shale.index.leases": _STORE,
    "shale.index.offsets": _STORE,
    "shale.index.restores": _STORE,
    "shale.metastore.api.auth": "the token file's helpers (digest, new_token, write_private) read as auth.*",
    "shale.metastore.api.sessions": "the status page's session cookie (Sessions, cookie_header) reads as sessions.*",
}


def deep_imports(path: Path, own: str, modules: set[str], faces: frozenset[str] = frozenset()) -> list[str]:
    """The modules of a Shale package other than ``own`` that the file's imports name: ``from shale.block.meta
    import X``, ``import shale.block.meta`` and ``from shale.block import meta`` all name ``shale.block.meta``.
    A part's face (in ``faces``: ``shale.metastore.api``) is a door like the package's own."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            named = {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            named = {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
        else:
            continue
        for name in named:
            parts = name.split(".")
            if parts[0] == "shale" and len(parts) > 2 and parts[1] != own and name in modules and name not in faces:
                found.add(name)
    return sorted(found)


def test_other_packages_are_imported_through_their_faces() -> None:
    """An import from another Shale package names the package itself (``from shale.block import BlockMeta``),
    never one of its modules: a package's face (its ``__init__`` and ``__all__``) is its contract, so moving or
    splitting a module inside a package changes no other package. A package split into parts may also be entered
    through a part's face (``from shale.metastore.api import auth``). The few modules other packages use as a
    namespace are listed in NAMESPACES with the reason."""
    modules = {_module(p) for p in SRC.rglob("*.py")}
    assert set(NAMESPACES) <= modules
    faces = frozenset(f"shale.{part}" for part in parts())
    wrong = [f"{path.relative_to(ROOT)} imports {name}" for path in sorted(SRC.rglob("*.py"))
             if package_of(path) not in ("__init__", "__main__")
             for name in deep_imports(path, package_of(path), modules, faces) if name not in NAMESPACES]
    assert wrong == []


def test_the_metastore_has_three_parts_in_order() -> None:
    """The metastore's parts, lowest first: the state machine's rules, replication, the API."""
    documented = parts()
    assert sorted((p for p in documented if p.startswith("metastore.")), key=documented.__getitem__) == [
        "metastore.rules", "metastore.raft", "metastore.api"]
    own = SRC / "metastore"
    assert {p.name for p in own.glob("*.py")} == {"__init__.py"}, "every metastore module is in a part"


def part_imports(path: Path, own: str, documented: dict[str, int], modules: set[str]) -> list[str]:
    """The file's imports of other parts of its package that break the order: ``own`` (``metastore.api``) may
    import its own part's modules, and of a part on a lower line only the face (``from shale.metastore.rules
    import StateMachine``); never a part above its own, a module behind a face, or the package's own face."""
    package = own.split(".", maxsplit=1)[0]
    wrong = []
    for name in sorted(_imports(path)):
        names = name.split(".")
        if len(names) < 3 or names[:2] != ["shale", package]:
            continue
        target = f"{package}.{names[2]}"
        if target == own:
            continue
        if target not in documented:
            wrong.append(f"{name}: the package's face, from inside a part")
        elif documented[target] >= documented[own]:
            wrong.append(f"{name}: a part above its own")
        elif len(names) > 3 and name in modules:
            wrong.append(f"{name}: a module behind the face of {target}")
    return wrong


def test_parts_import_only_their_own_part_or_lower_ones_through_their_faces() -> None:
    """The rules know nothing of replication, replication nothing of the API, and each part is entered through
    its face. Imports of other packages are checked above, as for any module of the package."""
    documented = parts()
    modules = {_module(p) for p in SRC.rglob("*.py")}
    wrong = [f"{path.relative_to(ROOT)} imports {problem}" for path in sorted(SRC.rglob("*.py"))
             if (own := part_of(path)) is not None for problem in part_imports(path, own, documented, modules)]
    assert wrong == []


def test_the_part_check_catches_an_upward_a_deep_and_a_face_import(tmp_path: Path) -> None:
    assert part_of(SRC / "metastore" / "rules" / "fsm.py") == "metastore.rules"
    assert part_of(SRC / "metastore" / "__init__.py") is None
    assert part_of(SRC / "block" / "meta.py") is None
    documented = {"metastore.rules": 1, "metastore.raft": 2, "metastore.api": 3}
    modules = {"shale.metastore.rules.fsm", "shale.metastore.rules", "shale.metastore.api.service"}
    sample = tmp_path / "sample.py"
    for own, text, problem in [
        ("metastore.rules", "def f():\n    from shale.metastore.api import MetastoreService\n", "a part above"),
        ("metastore.raft", "from shale.metastore.rules.fsm import StateMachine\n", "behind the face"),
        ("metastore.raft", "from shale.metastore.rules import fsm\n", "behind the face"),
        ("metastore.raft", "from shale.metastore import StateMachine\n", "the package's face"),
    ]:
        sample.write_text(text)
        found = part_imports(sample, own, documented, modules)
        assert found, text
        assert all(problem in f for f in found), (text, found)
    sample.write_text("from shale.metastore.rules import StateMachine\nfrom shale.metastore.api.service import X\n")
    assert part_imports(sample, "metastore.api", documented, modules) == []


def test_the_face_check_sees_every_form_of_a_deep_import(tmp_path: Path) -> None:
    modules = {"shale.block.meta", "shale.block", "shale.query.plan"}
    for text in ("from shale.block.meta import BlockMeta\n", "def f():\n    import shale.block.meta\n",
                 "from shale.block import meta\n"):
        sample = tmp_path / "sample.py"
        sample.write_text(text)
        assert deep_imports(sample, "query", modules) == ["shale.block.meta"], text
        assert deep_imports(sample, "block", modules) == []
    sample = tmp_path / "sample.py"
    sample.write_text("from shale.block import BlockMeta\nfrom shale import block\n")
    assert deep_imports(sample, "query", modules) == []


def test_the_layering_check_catches_an_upward_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from shale.cli import main\n")
    assert imports(module) == {"cli"}
    assert layers()["cli"] > layers()["block"]


ALLOWED = ("shale.dev", "shale.demo", "shale.cli.dev_cmd")


def _module(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
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
    files = sorted(SRC.rglob("*.py"))
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


def module_graph(root: Path = SRC) -> dict[str, set[str]]:
    """Module -> the Shale modules it imports, function-level and type-checking imports included. ``from a import
    b`` imports the module ``a.b`` when there is one, else (a name defined in ``a``) the module ``a``."""
    paths = {_module(p): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names if alias.name in paths)
            elif isinstance(node, ast.ImportFrom) and node.module in paths:
                targets.update(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in paths else node.module
                               for a in node.names)
        graph[module] = targets - {module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles: strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles() -> None:
    graph = module_graph()
    assert len(graph) > 50
    assert cycles(graph) == []


def test_the_cycle_check_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
