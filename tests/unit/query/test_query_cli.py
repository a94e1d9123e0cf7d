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
from shale.encoder.chunks import Chunk, GroupSpec, write_chunk
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
    rule = ParserRule(parser="json", options={"time_field": "ts", "label_fields": ["level"]})
    ingest = IngestConfig(default_tenant="acme", parsers=[rule])
    written = write_chunk(GroupSpec("partition", 1, config.bucket, ingest), open_bucket(config.bucket), table,
                          Chunk("app", 0, "", 0, COUNT, BASE_MS + 3650 * 86_400_000))
    command = batch_commit([written], [PartitionRange("app", 0, "", 0, COUNT)], group="partition", generation=1,
                           writer="ingest", batch="b")  # type: ignore[arg-type]
    open_metastore(config).submit(command).raise_for_rejection()
    return [*sets, "query", "--tenant", "acme", "--from", "2026-11-01", "--to", "2026-12-01"]


def test_microseconds_survive_and_every_format_writes_times_alike(args: list[str]) -> None:
    runner = CliRunner()
    lines = runner.invoke(cli, [*args, "--format", "json"]).stdout.splitlines()
    rows = [json.loads(line) for line in lines]
    assert len(rows) == COUNT
    assert {r["offset"]: r["event_time"] for r in rows} == {i: _stamp(i) for i in range(COUNT)}
    out = runner.invoke(cli, [*args, "--format", "csv"]).stdout
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
    assert [json.loads(line)["offset"] for line in ordered.stdout.splitlines()] == [59, 58, 57]
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
    rows = [json.loads(line)["offset"] for line in CliRunner().invoke(cli, bounded).stdout.splitlines()]
    assert rows == [7]


# The first hour, round two: answers that never mislead.

def test_a_misspelled_topic_is_an_error_naming_the_topics_that_exist(args: list[str]) -> None:
    result = CliRunner().invoke(cli, [*args, '{topic="ap"}'])
    assert result.exit_code == 1
    assert 'no partition group record of tenant acme has topic="ap" at any time; its topic values: app' \
        in result.output
    assert CliRunner().invoke(cli, [*args, '{topic="app"}']).exit_code == 0
    label = CliRunner().invoke(cli, [*args, '{level="INF"}'])
    assert label.exit_code == 1
    assert 'has level="INF" at any time; its level values: INFO' in label.output


def test_a_column_that_exists_outside_the_window_is_not_called_unknown(args: list[str]) -> None:
    before = [*args[:-4], "--from", "2026-10-01", "--to", "2026-10-02", "--columns", "level"]
    result = CliRunner().invoke(cli, before)
    assert result.exit_code == 1
    assert "column(s) level exist in the selected records, but in none of those between 2026-10-01T00:00:00.000Z " \
        "and 2026-10-02T00:00:00.000Z" in result.output
    assert "unknown columns" not in result.output
    really = CliRunner().invoke(cli, [*before[:-1], "levle"])
    assert "unknown columns ['levle']" in really.output


def test_a_window_that_cut_matching_rows_says_so_with_their_range(args: list[str]) -> None:
    whole = CliRunner().invoke(cli, [*args, "--format", "json"])
    assert whole.exit_code == 0
    assert "outside the window" not in whole.stderr
    part = CliRunner().invoke(cli, [*args[:-4], "--from", "2026-11-22", "--to", "2026-12-01", "--format", "json"])
    assert 0 < len(part.stdout.splitlines()) < COUNT
    assert f"they span {_stamp(COUNT - 1)[:23]}Z to {_stamp(0)[:23]}Z" in part.stderr
    empty = CliRunner().invoke(cli, [*args[:-4], "--from", "2026-10-01", "--to", "2026-10-02"])
    assert "showing 0 of 0 rows" in empty.stdout
    assert "matching records also exist outside the window" in empty.stderr


def test_the_default_table_shows_the_parsed_columns_not_the_raw_value(args: list[str]) -> None:
    result = CliRunner().invoke(cli, [*args, "--limit", "1"])
    assert result.exit_code == 0
    header = result.stdout.splitlines()[1]
    assert "level" in header
    assert "value" not in header
    assert "value, headers, timestamp_type not shown (--columns or --format json shows them)" in result.stderr
    asked = CliRunner().invoke(cli, [*args, "--limit", "1", "--columns", "offset,value"])
    assert "value" in asked.stdout.splitlines()[1]


def test_shale_read_is_the_query_in_one_call(args: list[str]) -> None:
    import datetime as dt

    import shale

    config = load_config(env={}, overrides=[args[1], args[3]])
    table = shale.read(config, tenant="acme", selector='{topic="app"}', start=dt.datetime(2026, 11, 1),
                       end="2026-12-01")
    assert sorted(table.column("offset").to_pylist()) == list(range(COUNT))
    assert table.schema.field("event_time").type.tz == "UTC"
    lines = CliRunner().invoke(cli, [*args, "--format", "json", '{topic="app"}']).stdout.splitlines()
    assert table.num_rows == len(lines)
    part = shale.read(config, tenant="acme", start="2026-11-22", end=dt.datetime(2026, 12, 1, tzinfo=dt.UTC),
                      columns=["offset"])
    assert part.column_names == ["offset"]
    assert 0 < part.num_rows < COUNT
