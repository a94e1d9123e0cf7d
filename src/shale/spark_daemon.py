"""Spark's Python daemon for Shale's sessions (``spark.python.daemon.module``): pyspark's own daemon, started with
pyspark and py4j imported from the installed packages instead of from the archives Spark puts first on every
Python worker's path (``pyspark.zip``, py4j's zip and spark-core's jar).

Why: before every task, a pyspark worker calls ``importlib.invalidate_caches()``, and every zip importer on the
path then reads its archive's directory again, in Python. With those three archives that is 80 ms of CPU per task
(measured on this project's machine, Python 3.11, pyspark 4.0.0; pyspark 4.1's worker still calls it): an eighth of
a backup-ingest task's Python time.
Without the archives the path holds directories only, whose caches are dropped for free. When pyspark or py4j
cannot be imported without them (a Spark distribution's own ``python/lib``), the path is left as it is.

The daemon's command line is unchanged (Spark passes the worker module as its first argument), so this module
only edits ``sys.path`` and then runs ``pyspark.daemon`` as the main module.
"""

from __future__ import annotations

import os
import runpy
import sys
from importlib.util import find_spec


def drop_spark_archives(path: list[str], needed: tuple[str, ...] = ("pyspark", "py4j")) -> list[str]:
    """``path`` without the archives on it (existing ``.zip`` and ``.jar`` files) when the ``needed`` modules
    import without them, else ``path`` itself."""
    kept = [p for p in path if not (p.endswith((".zip", ".jar")) and os.path.isfile(p))]
    if len(kept) == len(path):
        return path
    saved = sys.path[:]
    try:
        sys.path[:] = kept
        found = all(find_spec(name) is not None for name in needed)
    finally:
        sys.path[:] = saved
    return kept if found else path


if __name__ == "__main__":
    kept = drop_spark_archives(sys.path)
    for dropped in set(sys.path) - set(kept):
        sys.path_importer_cache.pop(dropped, None)  # importers made while this module was found
    sys.path[:] = kept
    runpy.run_module("pyspark.daemon", run_name="__main__", alter_sys=True)
