"""Schema versions are data (issue 31): the metastore indexes the Schema Registry ids of every live block's typed
datasets (``block_schemas``), kept exactly equal to what the blocks' metadata says as blocks come and go, filled in
for the blocks of an older state when it is opened, and listed per topic, group and generation (API, CLI)."""

from __future__ import annotations

import json
import sqlite3
import tempfile
from pathlib import Path

from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.factories import BASE_MS
from tests.unit.metastore.helpers import meta

from shale.block import BlockMeta
from shale.cli import cli
from shale.config import load_config
from shale.index.schema import _FILL_BLOCK_SCHEMAS
from shale.metastore import AddBlocks, QuarantineBlocks, ReplaceBlocks, StateMachine, open_metastore


def typed(block: BlockMeta, ids: list[int], topic: str = "app", fingerprint: str = "f00d") -> BlockMeta:
    raw = block.model_dump()
    datasets = [{**d, "topic": topic, "schema_ids": ids or None, "schema_fingerprint": fingerprint if ids else None}
                for d in raw["datasets"]]
    return BlockMeta.model_validate({**raw, "datasets": datasets})


def indexed(state: StateMachine) -> list[tuple[str, int, int, int, str]]:
    return sorted(state.reader.conn.execute("SELECT * FROM block_schemas"))


def derived(state: StateMachine) -> list[tuple[str, int, int, int, str]]:
    """What the live blocks' metadata says, computed from scratch by the migration's own query."""
    conn = sqlite3.connect(":memory:")
    conn.execute(f"ATTACH DATABASE 'file:{state.path}?mode=ro' AS s")
    conn.executescript("CREATE TEMP TABLE blocks AS SELECT * FROM s.blocks; CREATE TEMP TABLE strings AS SELECT * "
                       "FROM s.strings; CREATE TEMP TABLE block_schemas (block_id TEXT, topic INTEGER, schema_id "
                       "INTEGER, tenant INTEGER, fingerprint TEXT, PRIMARY KEY (block_id, topic, schema_id));"
                       + _FILL_BLOCK_SCHEMAS)
    return sorted(conn.execute("SELECT * FROM temp.block_schemas"))


def test_schema_versions_per_topic_group_and_generation(tmp_path: Path) -> None:
    state = StateMachine(tmp_path / "s.db")
    blocks = [typed(meta(start=0, end=10, time_ms=BASE_MS), [3, 7]),
              typed(meta(start=10, end=20, time_ms=BASE_MS + 60_000), [7]),
              typed(meta(start=0, end=10, group="partition", generation=2, key="p2"), [7], fingerprint="beef"),
              typed(meta(topic="other", start=0, end=5, key="o"), [], topic="other"),
              typed(meta(tenant="beta", start=0, end=5, key="b"), [9])]
    state.apply_next(1, BASE_MS, AddBlocks(blocks=blocks))
    rows = [(r.topic, r.schema_id, r.fingerprint, r.group, r.generation, r.blocks)
            for r in state.reader.schema_versions("acme")]
    assert rows == [("app", 3, "f00d", "backup", 1, 1), ("app", 7, "beef", "partition", 2, 1),
                    ("app", 7, "f00d", "backup", 1, 2)]
    assert state.reader.schema_versions("acme", "other") == []
    [beta] = state.reader.schema_versions("beta")
    assert (beta.schema_id, beta.min_time) == (9, blocks[4].min_time)


def test_schema_versions_name_the_record_type_of_a_topic_stored_per_type(tmp_path: Path) -> None:
    raw = meta(start=0, end=10).model_dump()
    datasets = [{**raw["datasets"][0], "name": f"records/app/{record}", "topic": "app", "record": record,
                 "schema_ids": [sid], "schema_fingerprint": f"f{sid}"} for record, sid in (("shop.Order", 3),
                                                                                          ("shop.Refund", 4))]
    state = StateMachine(tmp_path / "s.db")
    state.apply_next(1, BASE_MS, AddBlocks(blocks=[BlockMeta.model_validate({**raw, "datasets": datasets})]))
    assert [(r.record, r.schema_id, r.fingerprint) for r in state.reader.schema_versions("acme")] == [
        ("shop.Order", 3, "f3"), ("shop.Refund", 4, "f4")]


ADD = st.tuples(st.just("add"), st.integers(0, 30), st.lists(st.integers(1, 5), max_size=3, unique=True),
                st.sampled_from(["app", "pay"]))
REMOVE = st.tuples(st.sampled_from(["compact", "quarantine"]), st.integers(0, 30), st.just([]), st.just(""))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.one_of(ADD, REMOVE), max_size=20))
def test_the_index_always_equals_what_the_live_blocks_metadata_says(steps: list[tuple[str, int, list[int], str]]
                                                                      ) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        state = StateMachine(Path(tmp) / "s.db")
        for op, n, ids, topic in steps:
            if op == "add":
                block = typed(meta(topic=topic, start=n * 10, end=n * 10 + 10, key=f"k{n}"), ids, topic=topic)
                state.apply_next(1, BASE_MS, AddBlocks(blocks=[block]))
            else:
                live = sorted(r[0] for r in state.reader.conn.execute("SELECT id FROM blocks"))
                if not live:
                    continue
                gone = live[n % len(live)]
                command = (ReplaceBlocks(tenant="acme", sources=[gone], blocks=[]) if op == "compact"
                           else QuarantineBlocks(tenant="acme", block_ids=[gone]))
                assert state.apply_next(1, BASE_MS, command).ok
            assert indexed(state) == derived(state)


def test_an_older_state_is_filled_in_when_opened(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    state = StateMachine(path)
    blocks = [typed(meta(start=0, end=10), [4, 5]), typed(meta(start=10, end=20), [])]
    state.apply_next(1, BASE_MS, AddBlocks(blocks=blocks))
    expected, full = indexed(state), state.state_hash()
    assert len(expected) == 2
    state.close()
    conn = sqlite3.connect(path)  # what a version-3 state has: no table of schemas
    conn.executescript("DROP TABLE block_schemas; UPDATE state SET value = 3 WHERE key = 'schema_version';")
    conn.close()
    reopened = StateMachine(path)
    assert indexed(reopened) == expected
    assert reopened.state_hash() == full


def test_shale_schemas_lists_them(tmp_path: Path) -> None:
    sets = ["--set", f"bucket.url=file://{tmp_path}/bucket", "--set", f"metastore.data_dir={tmp_path}/ms"]
    config = load_config(env={}, overrides=[s for s in sets if s != "--set"])
    assert open_metastore(config).submit(AddBlocks(blocks=[typed(meta(start=0, end=10), [12])])).ok
    runner = CliRunner()
    listed = runner.invoke(cli, [*sets, "schemas", "--tenant", "acme", "--json"])
    assert listed.exit_code == 0, listed.output
    assert [(r["topic"], r["schema_id"], r["blocks"]) for r in map(json.loads, listed.output.splitlines())] == [
        ("app", 12, 1)]
    table = runner.invoke(cli, [*sets, "schemas", "--tenant", "acme"])
    assert table.output.splitlines()[0].split()[:3] == ["TOPIC", "RECORD", "SCHEMA"]
    assert table.output.splitlines()[1].split()[:5] == ["app", "-", "12", "-", "f00d"]  # no registry: no own
    none = runner.invoke(cli, [*sets, "schemas", "--tenant", "nobody"])
    assert none.exit_code == 0
    assert "no blocks of tenant 'nobody'" in none.output
