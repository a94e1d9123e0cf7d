"""``python -m bench [name ...]``: run the named benchmarks (default: all) and record their results."""

from __future__ import annotations

import importlib
import sys

BENCHMARKS = ["fetcher_sync", "metastore", "ingest", "compaction", "bucket_index", "query", "reprocess"]


def main(argv: list[str]) -> int:
    names = argv or BENCHMARKS
    unknown = sorted(set(names) - set(BENCHMARKS))
    if unknown:
        print(f"unknown benchmarks {unknown}; choose from {BENCHMARKS}", file=sys.stderr)
        return 2
    for name in names:
        module = importlib.import_module(f"bench.{name}")
        result = module.run()
        print(f"{name}: figures {result['figures']} baseline {result['baseline']} ratios {result['ratios']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
