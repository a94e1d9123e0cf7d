"""Only writers open the metastore's state for writing: a ``StateMachine`` is constructed, and ``open_metastore``
called, only by the functions listed here, each a writer; every other reader goes through ``open_index_view``
(a ``read_only_index`` when embedded, a ``MetastoreClient`` when remote), which never creates a state file."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from click.testing import CliRunner

from shale.cli import cli

SRC = Path(__file__).resolve().parents[2] / "src" / "shale"

STATE_WRITERS = {
    "shale.metastore.api.server:open_metastore": "the embedded service, for writers",
    "shale.metastore.api.server:MetastoreNode.__init__": "a metastore node applies the log",
    "shale.metastore.raft.rebuild:rebuild_from_bucket": "writes a new state file from the bucket",
    "shale.cli.iceberg_cmd:sync": "publishes and trims the change feed (TrimBlockChanges)",
}
OPEN_METASTORE_CALLERS = {
    "shale.cli.common:reachable_metastore": "with write=True only (bucket repair --apply)",
    "shale.cli.offsets_cmd:acknowledge_loss": "AcknowledgeOffsetLoss",
    "shale.cli.shards_cmd:set_count": "SetIngestShards",
    "shale.cli.compact_cmd:compact": "the worker's polls and SetCompactionFailureLimit (--jobs reads the view)",
    "shale.cli.reprocess_cmd:reprocess": "CommitIngestBatch(writer=reprocess)",
    "shale.cli.reprocess_cmd:switch": "SetActiveGeneration",
    "shale.cli.restore_cmd:restore": "RecordRestore (a dry run reads the view)",
    "shale.cli.erase_cmd:erase": "RequestErasure and PlanErasure (a dry run reads the view)",
    "shale.cli.erase_cmd:status": "RecordErasureReceipt (with --receipt; otherwise it reads the view)",
    "shale.ingest.job:IngestJob.__init__": "CommitIngestBatch",
    "shale.demo.pipeline:run_demo": "ingests and compacts",
}


def _module(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def callers(source: str, module: str, name: str) -> set[str]:
    """``module:function`` (``Class.method`` for methods) of every call of ``name`` in ``source``."""
    found: set[str] = set()

    def visit(node: ast.AST, scope: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, [*scope, child.name])
                continue
            if isinstance(child, ast.Call):
                f = child.func
                called = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
                if called == name:
                    found.add(f"{module}:{'.'.join(scope) or '<module>'}")
            visit(child, scope)

    visit(ast.parse(source), [])
    return found


def _all_callers(name: str) -> set[str]:
    files = sorted(SRC.rglob("*.py"))
    assert len(files) > 50
    return {c for path in files for c in callers(path.read_text(), _module(path), name)}


def test_only_writers_construct_a_state_machine() -> None:
    assert _all_callers("StateMachine") == set(STATE_WRITERS)


def test_only_writers_open_the_writable_metastore() -> None:
    assert _all_callers("open_metastore") == set(OPEN_METASTORE_CALLERS)


def test_the_check_finds_calls_in_functions_and_methods() -> None:
    source = ("def reads():\n    return StateMachine(p)\n\nclass Node:\n    def __init__(self):\n"
              "        self.state = m.StateMachine(p)\n")
    assert callers(source, "x", "StateMachine") == {"x:reads", "x:Node.__init__"}


@pytest.mark.parametrize("command", [["offsets", "show"], ["metastore", "status"], ["compact", "--jobs"],
                                     ["trace", "01JBZ0000000000000000000AB"],
                                     ["ledger", "--topic", "app"]])
def test_a_read_only_command_never_creates_an_empty_state(tmp_path: Path, command: list[str]) -> None:
    sets = ["--set", f"bucket.url=file://{tmp_path}/bucket", "--set", f"metastore.data_dir={tmp_path}/ms"]
    result = CliRunner().invoke(cli, [*sets, *command])
    assert result.exit_code == 1, result.output
    assert "no metastore state at" in result.output
    assert not (tmp_path / "ms").exists() or not any((tmp_path / "ms").iterdir())
