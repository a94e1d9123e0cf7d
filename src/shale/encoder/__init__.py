"""The record encoder (seed 002's parsing and writing): Kafka records, as an ingest task's consumer gives them, into
blocks of the backup or partition group, for whoever writes blocks (ingest, reprocess, repair).

The public face: ``write_chunk`` turns one chunk of one Kafka partition's records into blocks (``Written``),
under a ``GroupSpec``; ``load_parser`` and ``Parser`` are the ``shale.parsers`` plug-in contract (parsers/);
``normalize`` makes Spark's Kafka rows the backup schema; ``parse_records`` is the parsing seam (a chunk's records
as Arrow in, typed columns and quarantine reasons out) for whoever needs a parser's columns without blocks. Spark
Python workers import this package: its names are imported on first use.
"""

import typing as _typing

from shale.exports import lazy_exports as _lazy_exports

if _typing.TYPE_CHECKING:
    from shale.encoder.chunks import (
        GROUPS,
        Chunk,
        GroupSpec,
        Written,
        decode_written,
        encode_written,
        top_reasons,
        write_chunk,
        write_chunks,
    )
    from shale.encoder.parsers import ParseError, Parser, load_parser
    from shale.encoder.parsers.registryparser import RegistryParser
    from shale.encoder.parsers.rulecheck import check_typed_rules, raise_for_errors
    from shale.encoder.parsing import parse_records
    from shale.encoder.records import normalize
    from shale.encoder.tenants import TenantMapper

__getattr__ = _lazy_exports(__name__, {  # each public name's module, imported on first use
    "GROUPS": "chunks",
    "Chunk": "chunks",
    "GroupSpec": "chunks",
    "Written": "chunks",
    "decode_written": "chunks",
    "encode_written": "chunks",
    "top_reasons": "chunks",
    "write_chunk": "chunks",
    "write_chunks": "chunks",
    "ParseError": "parsers",
    "Parser": "parsers",
    "load_parser": "parsers",
    "RegistryParser": "parsers.registryparser",
    "check_typed_rules": "parsers.rulecheck",
    "raise_for_errors": "parsers.rulecheck",
    "normalize": "records",
    "parse_records": "parsing",
    "TenantMapper": "tenants",
})

__all__ = [
    "GROUPS",
    "Chunk",
    "GroupSpec",
    "ParseError",
    "Parser",
    "RegistryParser",
    "TenantMapper",
    "Written",
    "check_typed_rules",
    "decode_written",
    "encode_written",
    "load_parser",
    "normalize",
    "parse_records",
    "raise_for_errors",
    "top_reasons",
    "write_chunk",
    "write_chunks",
]
