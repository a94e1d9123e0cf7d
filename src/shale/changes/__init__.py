"""Change tables (docs/design/change-tables.md): upsert and Debezium topics read as the latest row per key.

``latest_view`` computes the view from a topic's stored history (its parsed rows and its quarantined records, each
with its incarnation); ``latest_view_and_versions`` also keeps the versions that decide it, so that a later view
need only add what was stored since, and ``latest_view_after`` adds it, recomputing only the keys it names;
``of_debezium_value`` and ``of_op`` say what one Debezium record means. ``shale.query`` reads the history and calls
it (``shale query --latest``, ``shale.read(latest=True)``, the Spark source's ``latest`` option)."""

from shale.changes.columns import INCARNATION, TableMode, TableRule, key_column
from shale.changes.envelope import Kind, Meaning, of_debezium_value, of_op
from shale.changes.view import Versions, ViewStats, latest_view, latest_view_after, latest_view_and_versions

__all__ = [
    "INCARNATION",
    "Kind",
    "Meaning",
    "TableMode",
    "TableRule",
    "Versions",
    "ViewStats",
    "key_column",
    "latest_view",
    "latest_view_after",
    "latest_view_and_versions",
    "of_debezium_value",
    "of_op",
]
