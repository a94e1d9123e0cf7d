"""`shale query` tells the truth (issue 29, case 7): microseconds kept from the record to every output, one ISO 8601
format with a zone in table, json and csv, "showing N of M" when the table stops, --order time, and an unknown
tenant is an error, not an empty table."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner
from tests.factories import BASE_MS, backup_table

from shale.cli import cli
from shale.config import IngestConfig, ParserRule, load_config
from shale.ingest.blocks import Chunk, GroupSpec, write_chunk
from shale.ingest.committer import batch_commit
from shale.ingest.plan import PartitionRange
from shale.metastore import open_metastore
from shale.objstore import open_bucket

COUNT = 60


def _stamp(i: int) -> str:
    """Record i's time: later offsets are earlier in time, each with its own microseconds."""
    return f"2026-11-2{1 + (COUNT - i) // 30}T07:{(COUNT - i) % 60:02d}:05.{383971 + i:06d}Z"


@pytest.fixture
def args(tmp_path: Path) -> list[str]:
    sets = ["--set", f"bucket.url=file://{tmp_path}/bucket", "--set", f"metastore.data_dir={tmp_path}/meta"]
    config = load_config(env={}, overrides=[s for s in sets if s != "--set"])
    table = backup_table("app", 0, 0, COUNT)
    values = [json.dumps({"ts": _stamp(i), "level": "INFO"}).encode() for i in range(COUNT)]
    table = table.set_column(table.schema.get_field_index("value"), "value", pa.array(values, pa.binary()))
    ingest = IngestConfig(default_tenant="acme", parsers=[ParserRule(parser="json", options={"time_field": "ts"})])
    written = write_chunk(GroupSpec("partition", 1, config.bucket, ingest), open_bucket(config.bucket), table,
                          Chunk("app", 0, "", 0, COUNT, BASE_MS + 3650 * 86_400_000))
    command = batch_commit([written], [PartitionRange("app", 0, "", 0, COUNT)], group="partition", generation=1,
                           writer="ingest", batch="b")  # type: ignore[arg-type]
    open_metastore(config).submit(command).raise_for_rejection()
    return [*sets, "query", "--tenant", "acme", "--from", "2026-11-01", "--to", "2026-12-01"]


def test_microseconds_survive_and_every_format_writes_times_alike(args: list[str]) -> None:
    runner = CliRunner()
    lines = runner.invoke(cli, [*args, "--format", "json"]).output.splitlines()
    rows = [json.loads(line) for line in lines]
    assert len(rows) == COUNT
    assert {r["offset"]: r["event_time"] for r in rows} == {i: _stamp(i) for i in range(COUNT)}
    out = runner.invoke(cli, [*args, "--format", "csv"]).output
    by_csv = {int(r["offset"]): r["event_time"] for r in csv.DictReader(io.StringIO(out))}
    assert by_csv == {i: _stamp(i) for i in range(COUNT)}
    table = runner.invoke(cli, [*args, "--columns", "offset,event_time", "--limit", "100"]).output
    assert _stamp(7) in table


def test_the_table_says_how_many_rows_it_left_out_and_orders_by_time(args: list[str]) -> None:
    runner = CliRunner()
    default = runner.invoke(cli, [*args, "--columns", "offset,event_time", "--limit", "5"])
    assert default.exit_code == 0, default.output
    assert "showing 5 of 60 rows (--limit N shows more)" in default.output
    assert default.output.count("2026-11-2") == 5
    ordered = runner.invoke(cli, [*args, "--columns", "offset,event_time", "--order", "time", "--format", "json",
                                  "--limit", "3"])
    assert [json.loads(line)["offset"] for line in ordered.output.splitlines()] == [59, 58, 57]
    everything = runner.invoke(cli, [*args, "--columns", "offset", "--limit", "100"])
    assert "showing 60 of 60 rows" in everything.output


def test_an_unknown_tenant_is_an_error(args: list[str]) -> None:
    wrong = [*args[:-6], "--tenant", "acmee", *args[-4:]]
    result = CliRunner().invoke(cli, wrong)
    assert result.exit_code == 1
    assert "tenant 'acmee' has no blocks; tenants: acme" in result.output


def test_stats_count_the_whole_query(args: list[str]) -> None:
    result = CliRunner().invoke(cli, [*args, "--limit", "3", "--stats"])
    assert result.exit_code == 0, result.output
    stats = [line for line in result.output.splitlines() if " rows from " in line]
    assert len(stats) == 1
    assert not stats[0].endswith(" 0.000s")


def test_a_bound_takes_every_microsecond_of_its_millisecond(args: list[str]) -> None:
    import datetime as dt

    moment = dt.datetime.fromisoformat(_stamp(7).replace("Z", "+00:00"))
    ms = int(moment.timestamp() * 1000)  # its millisecond; the record lies 978 microseconds into it
    bounded = [*args[:-4], "--from", str(ms), "--to", str(ms), "--format", "json", "--columns", "offset"]
    rows = [json.loads(line)["offset"] for line in CliRunner().invoke(cli, bounded).output.splitlines()]
    assert rows == [7]
