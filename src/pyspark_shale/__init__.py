"""Makes ``spark.read.format("shale")`` available in every Spark session of an environment where Shale is
installed, with no registration call: Spark (4.0 and later) imports each top-level ``pyspark_*`` module of the
Python path and registers its ``DefaultSource`` when a session first resolves a Python data source
(``pyspark.sql.worker.lookup_data_sources``)."""

from shale.query.datasource import ShaleDataSource as DefaultSource

__all__ = ["DefaultSource"]
