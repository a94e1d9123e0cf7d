"""Every SQL statement Shale runs on its state is written in ``shale.index``, in the store of its table family:
no string of Shale's source outside the index starts a SQL statement (Spark's and the development query engines'
SQL, in ``shale.dev`` and ``shale.demo``, is not the state's)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[3] / "src" / "shale"
STATEMENT = re.compile(r"\s*(SELECT|INSERT|UPDATE|DELETE|CREATE|ALTER|DROP|BEGIN|COMMIT|ROLLBACK|SAVEPOINT|RELEASE|"
                       r"PRAGMA)\b")
OTHER_SQL = ("index", "dev", "demo")


def sql_outside_the_index(root: Path = SRC) -> list[str]:
    """``path:line`` of each string outside ``OTHER_SQL`` that starts a SQL statement."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).parts[0] in OTHER_SQL:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and STATEMENT.match(node.value):
                found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_no_sql_is_written_outside_the_index() -> None:
    assert sql_outside_the_index() == []


def test_the_check_finds_a_statement_outside_the_index(tmp_path: Path) -> None:
    (tmp_path / "metastore").mkdir()
    (tmp_path / "index").mkdir()
    (tmp_path / "metastore" / "x.py").write_text('def f(conn):\n    conn.execute(f"SELECT 1 FROM {t}")\n')
    (tmp_path / "index" / "y.py").write_text('def f(conn):\n    conn.execute("BEGIN IMMEDIATE")\n')
    assert sql_outside_the_index(tmp_path) == ["metastore/x.py:2"]
