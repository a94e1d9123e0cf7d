"""Schemas of typed topics: the Schema Registry client and its per-process cache (``registry``), the Confluent
wire format (``wire``), Avro writer schemas as Arrow types and their fingerprints (``avro``). Below ingest,
compactor, query and iceberg, which use it; it imports none of them."""

from shale.schemas.avro import Decoder, SchemaError, arrow_type, fingerprint
from shale.schemas.registry import RegisteredSchema, RegistryClient, RegistryUnavailableError, UnknownSchemaError
from shale.schemas.wire import FramingError, frame, schema_id

__all__ = ["Decoder", "FramingError", "RegisteredSchema", "RegistryClient", "RegistryUnavailableError", "SchemaError",
           "UnknownSchemaError", "arrow_type", "fingerprint", "frame", "schema_id"]
