"""Reprocessing (seed 002: "data corruption caused by bugs in the message parsers should be reversible"): run a
(fixed) parser over the backup group's verbatim records into a new generation of the partition group, while
live ingestion goes on; then switch readers to it. See job.py for the sequence, trace.py for traceability."""

import typing as _typing

from shale.exports import lazy_exports as _lazy_exports

if _typing.TYPE_CHECKING:
    from shale.reprocess.job import ReprocessJob, ReprocessReport
    from shale.reprocess.schema import ReaderSchema
    from shale.reprocess.trace import locate, trace_block

__getattr__ = _lazy_exports(__name__, {  # each public name's module, imported on first use
    "ReprocessJob": "job",
    "ReprocessReport": "job",
    "ReaderSchema": "schema",
    "locate": "trace",
    "trace_block": "trace",
})


__all__ = ["ReaderSchema", "ReprocessJob", "ReprocessReport", "locate", "trace_block"]
