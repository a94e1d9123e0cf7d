"""``shale demo`` (what ``make demo`` runs), end to end in its own process with its own Kafka broker and a bucket on
the local filesystem: both ingest groups store every record once, compaction runs and changes nothing, and the
query through a bucket index returns the same records as before compaction from fewer objects, without a LIST
call; Spark never warns that the hostname resolves to a loopback address. The Avro topic (Zookeeper lines written by
AvroSerializer through the real registry, the schema evolved halfway) comes back typed through `shale query` and
Spark SQL, the decimal summed exactly per enum value."""

from __future__ import annotations

import decimal
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

from shale.demo import loghub_lines


def test_demo_runs_the_whole_pipeline(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "shale", "demo", "--workdir", str(tmp_path)], capture_output=True,
                          text=True, timeout=900, check=False)
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr[-4000:]
    assert "demo OK" in out
    # The embedded default bucket is a folder: the blocks are there, and no S3 server was started.
    assert f"bucket: file://{tmp_path / 'bucket'}" in out, out
    assert any((tmp_path / "bucket").rglob("meta.json"))
    assert not (tmp_path / "minio").exists()
    assert "resolves to a loopback address" not in out + proc.stderr  # Spark binds to loopback without guessing
    # 7 topics x 2 groups, verified before and after compaction: 0 missing / 0 duplicated / 0 quarantined.
    assert len(re.findall(r"2000 stored, 0 / 0 / 0", out)) == 28, out
    jobs = re.search(r"(\d+) jobs done; blocks now (.*)", out)
    assert jobs is not None, out
    assert int(jobs.group(1)) > 0
    before = re.search(r"on tenant infra: (\d+) records from (\d+) objects", out)
    after = re.search(r"through the bucket index \(no metastore\): (\d+) records from (\d+) objects .*with (\d+) LIST",
                      out)
    assert before is not None, out
    assert after is not None, out
    assert int(after.group(1)) == int(before.group(1)) > 0
    assert int(after.group(2)) < int(before.group(2))
    assert int(after.group(3)) == 0

    # The typed table: Spark sees the Avro types, the decimal sums exactly per level (the enum), old and new rows.
    for column, spark_type in (("ts", "timestamp"), ("level", "string"), ("size_kb", "decimal(8,3)"),
                               ("source", "struct<thread:string,logger:string,line:int>"), ("peer", "string")):
        assert f"\n  {column}: {spark_type}\n" in out, out
    lines, size = Counter[str](), Counter[str]()
    for line in loghub_lines("Zookeeper"):
        level = line.split()[3].decode()
        lines[level] += 1
        size[level] += len(line)
    for level in ("ERROR", "INFO", "WARN"):
        kb = decimal.Decimal(size[level]).scaleb(-3)
        # Spark SQL's answer, then DuckDB's on the published Iceberg table: the same line twice
        assert out.count(f"    {level}: {lines[level]} lines, sum(size_kb) = {kb} kB") == 2, out
    assert "rows written with schema v1: 1000, with v2 (the added field peer): 1000" in out, out
    assert f"showing 4 of {lines['ERROR']} rows" in out, out  # shale query, level="ERROR" (a label of the enum)
    assert "the same as Spark SQL's answer: yes" in out, out
