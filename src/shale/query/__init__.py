"""Reading stored records: the Python API (``read``, a table in one call; ``run_query``, a stream),
 the ``shale query`` CLI, and the Spark data source
``spark.read.format("shale")`` (see datasource.py)."""

from shale.query.plan import BlockSource, Part, QueryPlan, plan_query
from shale.query.reader import Query, QueryStats, execute, run_query
from shale.query.table import read

__all__ = ["BlockSource", "Part", "Query", "QueryPlan", "QueryStats", "execute", "plan_query", "read", "run_query"]
