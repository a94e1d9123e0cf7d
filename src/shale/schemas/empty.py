"""Empty records: a record type with no fields is stored as a struct with one marker field, because Parquet cannot
write a struct without children.

An Avro record type with no fields is valid, and a registry accepts it. Its Arrow type would be ``struct<>``, which
Parquet cannot write: every block of a batch holding one would fail, and the batch with it, for ever. Its stored
Arrow type is therefore ``EMPTY_RECORD``, ``struct<"$empty": bool>``, the marker true for every record present (a
null record stays a null struct); blocks, compaction, erasure and Iceberg carry it as any struct. Readers that give
values back (``shale.read``, ``shale query``, ``spark.read.format("shale")``) read it as the writer's value, an
empty record (``struct<>``, ``{}``): ``read_type`` is the type they return, and Arrow's cast of the stored column to
it drops the marker; a reader that writes Parquet again (``shale query --format parquet``) casts back to
``parquet_type``, whose marker is then null (the record is still present: its struct is not null). The marker's
name holds a ``$``, which no Avro or Protobuf field name can have, so no record a writer wrote is taken for an
empty one. A record type with no fields at the top level is a value with no columns, and needs no marker.
"""

from __future__ import annotations

import pyarrow as pa

EMPTY_RECORD_FIELD = "$empty"
EMPTY_RECORD = pa.struct([pa.field(EMPTY_RECORD_FIELD, pa.bool_())])
EMPTY_RECORD_VALUE = {EMPTY_RECORD_FIELD: True}


def read_type(t: pa.DataType) -> pa.DataType:
    """``t`` as readers return it: every ``EMPTY_RECORD`` inside it an empty struct."""
    if t == EMPTY_RECORD:
        return pa.struct([])
    if pa.types.is_struct(t):
        return pa.struct([t.field(i).with_type(read_type(t.field(i).type)) for i in range(t.num_fields)])
    if pa.types.is_map(t):
        return pa.map_(t.key_field, t.item_field.with_type(read_type(t.item_type)))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(t.value_field.with_type(read_type(t.value_type)))
    return t


def parquet_type(t: pa.DataType) -> pa.DataType:
    """``t`` as Parquet can write it: every empty struct inside it ``EMPTY_RECORD`` (``read_type``'s inverse)."""
    if pa.types.is_struct(t):
        if t.num_fields == 0:
            return EMPTY_RECORD
        return pa.struct([t.field(i).with_type(parquet_type(t.field(i).type)) for i in range(t.num_fields)])
    if pa.types.is_map(t):
        return pa.map_(t.key_field, t.item_field.with_type(parquet_type(t.item_type)))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(t.value_field.with_type(parquet_type(t.value_type)))
    return t
