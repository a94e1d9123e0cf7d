"""Schemas of typed topics: the Schema Registry client and its per-process cache (``registry``), the Confluent
wire format (``wire``), writer schemas as Arrow types with their decoders and fingerprints (``avro``, ``protobuf``,
``jsonschema``). Below ingest, compactor, query and iceberg, which use it; it imports none of them."""

import typing as _typing

from shale.exports import lazy_exports as _lazy_exports
from shale.schemas.avro import Decoder, SchemaError, arrow_type, fingerprint
from shale.schemas.empty import EMPTY_RECORD, EMPTY_RECORD_FIELD, parquet_type, read_type
from shale.schemas.registry import (
    KnownSchemas,
    RegisteredSchema,
    RegistryClient,
    RegistryUnavailableError,
    SchemaReference,
    UnknownSchemaError,
    with_references,
)
from shale.schemas.wire import FramingError, frame, id_counts, message_indexes, payload, schema_id

if _typing.TYPE_CHECKING:
    from shale.schemas.protobuf_versions import Resolver, ValueMismatchError

__getattr__ = _lazy_exports(__name__, {  # each public name's module, imported on first use
    "Resolver": "protobuf_versions",
    "ValueMismatchError": "protobuf_versions",
})

__all__ = [
    "EMPTY_RECORD",
    "EMPTY_RECORD_FIELD",
    "Decoder",
    "FramingError",
    "KnownSchemas",
    "RegisteredSchema",
    "RegistryClient",
    "RegistryUnavailableError",
    "Resolver",
    "SchemaError",
    "SchemaReference",
    "UnknownSchemaError",
    "ValueMismatchError",
    "arrow_type",
    "fingerprint",
    "frame",
    "id_counts",
    "message_indexes",
    "parquet_type",
    "payload",
    "read_type",
    "schema_id",
    "with_references",
]
