"""The record encoder (seed 002's parsing and writing): Kafka records, as Spark's Kafka source gives them, into
blocks of the backup or partition group, for whoever writes blocks (ingest, reprocess, repair).

The public face: ``write_chunk`` turns one chunk of one Kafka partition's records into blocks (``Written``),
under a ``GroupSpec``; ``load_parser`` and ``Parser`` are the ``shale.parsers`` plug-in contract (parsers/);
``normalize`` makes Spark's Kafka rows the backup schema. Spark Python workers import this package: its names
are imported on first use.
"""

import typing as _typing

from shale.exports import lazy_exports as _lazy_exports

if _typing.TYPE_CHECKING:
    from shale.encoder.chunks import GROUPS, Chunk, GroupSpec, Written, write_chunk
    from shale.encoder.parsers import ParseError, Parser, load_parser
    from shale.encoder.records import normalize
    from shale.encoder.tenants import TenantMapper

__getattr__ = _lazy_exports(__name__, {  # each public name's module, imported on first use
    "GROUPS": "chunks",
    "Chunk": "chunks",
    "GroupSpec": "chunks",
    "Written": "chunks",
    "write_chunk": "chunks",
    "ParseError": "parsers",
    "Parser": "parsers",
    "load_parser": "parsers",
    "normalize": "records",
    "TenantMapper": "tenants",
})

__all__ = [
    "GROUPS",
    "Chunk",
    "GroupSpec",
    "ParseError",
    "Parser",
    "TenantMapper",
    "Written",
    "load_parser",
    "normalize",
    "write_chunk",
]
