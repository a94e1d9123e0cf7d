"""Reprocessing (seed 002: "data corruption caused by bugs in the message parsers should be reversible"): run a
(fixed) parser over the backup group's verbatim records into a new generation of the partition group, while
live ingestion goes on; then switch readers to it. See job.py for the sequence, trace.py for traceability."""

import typing as _typing
from importlib import import_module as _import_module

if _typing.TYPE_CHECKING:
    from shale.reprocess.job import ReprocessJob, ReprocessReport
    from shale.reprocess.schema import ReaderSchema
    from shale.reprocess.trace import locate, trace_block

_HOMES = {  # each public name's module, imported on first use (PEP 562)
    "ReprocessJob": "job",
    "ReprocessReport": "job",
    "ReaderSchema": "schema",
    "locate": "trace",
    "trace_block": "trace",
}


def __getattr__(name: str) -> object:
    """A public name, imported on first use: a Spark Python worker that runs ``shale.reprocess.task`` imports
    what the task needs, not the driver's job and the metastore client."""
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(_import_module(f"{__name__}.{_HOMES[name]}"), name)


__all__ = ["ReaderSchema", "ReprocessJob", "ReprocessReport", "locate", "trace_block"]
