"""``python -m bench [name ...]``: run the named benchmarks (default: all) and record their results;
``python -m bench targets``: generate docs/BENCHMARKS.md's targets table from the committed results."""

from __future__ import annotations

import importlib
import subprocess
import sys

BENCHMARKS = ["fetcher_sync", "metastore", "ingest", "compaction", "bucket_index", "query", "reprocess", "iceberg",
              "cluster", "freshness", "typed_decode", "typed_ingest", "restore", "takeover", "recovery",
              "peers", "erase", "scale", "metadata_scale", "efficiency", "decode",
              "change_tables", "cost"]
# Run by name only (``python -m bench interop``): its engines' downloads are large, and it answers questions rather
# than measuring speed.
BY_NAME_ONLY = ["interop", "spark_versions"]


def main(argv: list[str]) -> int:
    if argv == ["targets"]:
        from bench.targets import DOC, rewrite

        DOC.write_text(rewrite())
        return 0
    names = argv or BENCHMARKS
    unknown = sorted(set(names) - set(BENCHMARKS) - set(BY_NAME_ONLY))
    if unknown:
        print(f"unknown benchmarks {unknown}; choose from {BENCHMARKS}", file=sys.stderr)
        return 2
    if len(names) > 1:
        # One process per benchmark: a JVM keeps the jars of its first SparkSession (with or without the Kafka
        # connector), and each benchmark should start from a cold process like the others.
        failed = [n for n in names
                  if subprocess.run([sys.executable, "-m", "bench", n], check=False).returncode != 0]
        if failed:
            print(f"benchmarks failed: {failed}", file=sys.stderr)
        return 1 if failed else 0
    module = importlib.import_module(f"bench.{names[0]}")
    result = module.run()
    print(f"{names[0]}: figures {result['figures']} baseline {result['baseline']} ratios {result['ratios']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
