"""Python workers of Shale's sessions import pyspark from the installed package, with none of Spark's archives on
their path (``shale.spark_daemon``): nothing for ``importlib.invalidate_caches()`` to re-read before every task."""

from __future__ import annotations

from collections.abc import Iterator


def test_workers_have_no_spark_archive_on_their_path(spark) -> None:  # type: ignore[no-untyped-def]
    def worker_path(_: Iterator[int]) -> Iterator[tuple[str, str]]:  # pickled by value: defined in the test
        import os
        import sys

        import pyspark

        archives = ",".join(p for p in sys.path if p.endswith((".zip", ".jar")) and os.path.isfile(p))
        yield archives, pyspark.__file__ or ""

    (archives, pyspark_file), = spark.sparkContext.parallelize([0], 1).mapPartitions(worker_path).collect()
    assert archives == ""
    assert ".zip" not in pyspark_file
    assert pyspark_file.endswith("pyspark/__init__.py")
