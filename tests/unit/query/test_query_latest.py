"""`shale query --latest` and ``shale.read(latest=True)`` over an upsert topic stored by the chunk writer: the same
latest rows, a tombstone applied, matchers on columns picking among the latest rows (not among versions), keys
withheld said on stderr, and clear errors for an append topic and --as-of without --latest."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner
from tests.factories import BASE_MS, backup_table

import shale
from shale.cli import cli
from shale.config import load_config
from shale.encoder.chunks import Chunk, GroupSpec, write_chunk
from shale.ingest.committer import batch_commit
from shale.ingest.plan import PartitionRange
from shale.metastore import QuarantineBlocks, open_metastore
from shale.objstore import open_bucket

CHANGES: list[tuple[bytes, bytes | None]] = [
    (b"a", b'{"ts": 1, "level": "ERROR"}'), (b"b", b'{"ts": 2, "level": "INFO"}'),
    (b"a", b'{"ts": 3, "level": "INFO"}'), (b"c", b'{"ts": 4, "level": "ERROR"}'), (b"b", None),
    (b"d", b'{"ts": 5, "level": "ERROR"}'), (b"d", b"not json"), (b"e", b'{"ts": 6, "level": "WARN"}')]


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    file = tmp_path / "shale.toml"
    file.write_text(f'[bucket]\nurl = "file://{tmp_path}/bucket"\n[metastore]\ndata_dir = "{tmp_path}/meta"\n'
                    '[ingest]\ndefault_tenant = "acme"\n'
                    '[[ingest.parsers]]\ntopic_pattern = "app"\nparser = "json"\ntable = "upsert"\n'
                    'options = {time_field = "ts", time_format = "epoch_s", label_fields = ["level"]}\n'
                    '[[ingest.parsers]]\ntopic_pattern = "log"\nparser = "json"\n'
                    'options = {time_field = "ts", time_format = "epoch_s"}\n')
    config = load_config(file, env={})
    count = len(CHANGES)
    for topic in ("app", "log"):
        table = backup_table(topic, 0, 0, count)
        table = table.set_column(table.schema.get_field_index("key"), "key", pa.array([k for k, _ in CHANGES]))
        table = table.set_column(table.schema.get_field_index("value"), "value",
                                 pa.array([v for _, v in CHANGES], pa.binary()))
        written = write_chunk(GroupSpec("partition", 1, config.bucket, config.ingest), open_bucket(config.bucket),
                              table, Chunk(topic, 0, "", 0, count, BASE_MS + 86_400_000))
        command = batch_commit([written], [PartitionRange(topic, 0, "", 0, count)], group="partition", generation=1,
                               writer="ingest", batch=topic)  # type: ignore[arg-type]
        open_metastore(config).submit(command).raise_for_rejection()
    return file


def _latest(out: str) -> dict[str, str]:
    return {r["key"]: r["level"] for r in map(json.loads, out.splitlines())}


def test_the_cli_and_shale_read_give_the_latest_rows(config_file: Path) -> None:
    args = ["--config", str(config_file), "query", "--tenant", "acme", "--latest", "--format", "json"]
    result = CliRunner().invoke(cli, [*args, '{topic="app"}'])
    assert result.exit_code == 0, result.output
    assert _latest(result.stdout) == {"a": "INFO", "c": "ERROR", "e": "WARN"}
    assert "1 keys left out" in result.stderr
    assert "invalid JSON" in result.stderr
    table = shale.read(config_file, tenant="acme", selector='{topic="app"}', latest=True)
    assert dict(zip(table.column("key").to_pylist(), table.column("level").to_pylist(), strict=True)) == \
        {b"a": "INFO", b"c": "ERROR", b"e": "WARN"}
    # a was ERROR once: a matcher picks among the latest rows, so it is not an ERROR row now.
    errors = CliRunner().invoke(cli, [*args, '{topic="app", level="ERROR"}'])
    assert _latest(errors.stdout) == {"c": "ERROR"}
    as_of = CliRunner().invoke(cli, [*args, "--as-of", str(BASE_MS + 1000), '{topic="app"}'])
    assert _latest(as_of.stdout) == {"a": "ERROR", "b": "INFO"}  # backup_table: one record per second


def test_records_gone_without_a_block_holding_them_are_gone_from_the_next_read(config_file: Path) -> None:
    """``shale.read`` keeps its versions for the next read (which then reads only what was stored since); a block
    a repair quarantines leaves no block holding its records: the next read reads the history again."""
    config = load_config(config_file, env={})
    metastore = open_metastore(config)
    first = [b.id for b in metastore.query_blocks(["acme"], 0, 2**62, '{topic="app"}', group="partition")]
    count = len(CHANGES)
    table = backup_table("app", 0, count, 1)
    table = table.set_column(table.schema.get_field_index("value"), "value", pa.array([b'{"ts": 9}'], pa.binary()))
    written = write_chunk(GroupSpec("partition", 1, config.bucket, config.ingest), open_bucket(config.bucket), table,
                          Chunk("app", 0, "", count, count + 1, BASE_MS + 86_400_000))
    metastore.submit(batch_commit([written], [PartitionRange("app", 0, "", count, count + 1)], group="partition",
                                  generation=1, writer="ingest", batch="more")).raise_for_rejection()
    assert shale.read(config, tenant="acme", selector='{topic="app"}', latest=True).num_rows == 4
    metastore.submit(QuarantineBlocks(tenant="acme", block_ids=first)).raise_for_rejection()
    assert shale.read(config, tenant="acme", selector='{topic="app"}', latest=True).num_rows == 1


def test_an_append_topic_and_as_of_without_latest_are_refused(config_file: Path) -> None:
    args = ["--config", str(config_file), "query", "--tenant", "acme"]
    result = CliRunner().invoke(cli, [*args, "--latest", '{topic="log"}'])
    assert result.exit_code != 0
    assert "topic 'log' is an append table" in result.output
    result = CliRunner().invoke(cli, [*args, "--as-of", "now", '{topic="app"}'])
    assert result.exit_code != 0
    assert "add --latest" in result.output
    with pytest.raises(ValueError, match="pass latest=True"):
        shale.read(config_file, tenant="acme", as_of="now")
