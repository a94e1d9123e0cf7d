"""Schemas of typed topics: the Schema Registry client and its per-process cache (``registry``), the Confluent
wire format (``wire``), writer schemas as Arrow types with their decoders and fingerprints (``avro``, ``protobuf``,
``jsonschema``). Below ingest, compactor, query and iceberg, which use it; it imports none of them."""

from shale.schemas.avro import Decoder, SchemaError, arrow_type, fingerprint
from shale.schemas.registry import (
    RegisteredSchema,
    RegistryClient,
    RegistryUnavailableError,
    SchemaReference,
    UnknownSchemaError,
)
from shale.schemas.wire import FramingError, frame, message_indexes, schema_id

__all__ = ["Decoder", "FramingError", "RegisteredSchema", "RegistryClient", "RegistryUnavailableError", "SchemaError",
           "SchemaReference", "UnknownSchemaError", "arrow_type", "fingerprint", "frame", "message_indexes",
           "schema_id"]
