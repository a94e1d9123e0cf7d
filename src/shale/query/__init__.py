"""Reading stored records: the Python API (``read``, a table in one call; ``run_query``, a stream),
 the ``shale query`` CLI, and the Spark data source
``spark.read.format("shale")`` (see datasource.py). ``register`` (it imports pyspark) and the CLI's output
writers are imported on first use."""

import typing as _typing

from shale.exports import lazy_exports as _lazy_exports
from shale.query.latest import read_latest, table_rule
from shale.query.plan import BlockSource, Part, QueryPlan, UnknownColumnsError, active_intervals, plan_query, row_filter
from shale.query.reader import Query, QueryStats, execute, run_query
from shale.query.sources import BucketIndexSource, open_source
from shale.query.table import read
from shale.query.times import parse_time

if _typing.TYPE_CHECKING:
    from shale.query.datasource import register
    from shale.query.hints import column_outside_window, outside_window, unmatched
    from shale.query.output import FORMATS, by_time, text_value, write_csv, write_json, write_parquet

__getattr__ = _lazy_exports(__name__, {  # each public name's module, imported on first use
    "register": "datasource",
    "column_outside_window": "hints",
    "outside_window": "hints",
    "unmatched": "hints",
    "FORMATS": "output",
    "by_time": "output",
    "text_value": "output",
    "write_csv": "output",
    "write_json": "output",
    "write_parquet": "output",
})

__all__ = [
    "FORMATS",
    "BlockSource",
    "BucketIndexSource",
    "Part",
    "Query",
    "QueryPlan",
    "QueryStats",
    "UnknownColumnsError",
    "active_intervals",
    "by_time",
    "column_outside_window",
    "execute",
    "open_source",
    "outside_window",
    "parse_time",
    "plan_query",
    "read",
    "read_latest",
    "register",
    "row_filter",
    "run_query",
    "table_rule",
    "text_value",
    "unmatched",
    "write_csv",
    "write_json",
    "write_parquet",
]
