"""Rows the index returns besides block metadata."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from shale.block import BlockMeta


class _Row(BaseModel):
    model_config = ConfigDict(frozen=True)


class OffsetRow(_Row):
    """The committed end of one topic-partition for one ingest group and generation."""

    group: str
    generation: int
    topic: str
    partition: int
    committed_end: int
    max_event_time: int
    updated_at: int
    incarnation: str = ""
    """The Kafka topic id of the incarnation these offsets belong to ('' = not recorded)."""
    writer: str = ""
    """``ingest`` or ``reprocess``: the only kind of writer this group and generation accepts."""
    skipped: int = 0
    """Offsets committed without a record (transaction markers, aborted records, offsets compacted away)."""


class IncarnationRow(_Row):
    """A past incarnation of a topic-partition (the topic was deleted and recreated): where its offsets ended."""

    group: str
    generation: int
    topic: str
    partition: int
    incarnation: str
    committed_end: int
    max_event_time: int
    skipped: int
    ended_at: int


class LossRow(_Row):
    """Offsets an operator acknowledged as lost (Kafka deleted them before Shale read them)."""

    group: str
    generation: int
    topic: str
    partition: int
    incarnation: str
    start: int
    end: int
    reason: str
    acknowledged_at: int


class TombstoneRow(_Row):
    """A block removed from the index whose objects are still to be deleted from the bucket."""

    seq: int
    block_id: str
    tenant: str
    shard: int
    created_at: int
    reason: str
    files: list[str]
    prefix: str = ""
    """The folder of the block's objects (``shale.block.layout.block_prefix`` of its metadata); '' from a
    metastore of before, whose blocks were all under ``<tenant>/blocks/``."""
    delay_ms: int = 0
    """The delete delay an erasure asked for (ms); 0: ``block.delete_delay``."""


class SchemaVersionRow(_Row):
    """A writer schema (Schema Registry id) of a tenant's topic, as the live blocks of one group and generation
    hold it: how many blocks and their data-time range, and the fingerprint the rows are stored under."""

    topic: str
    schema_id: int
    fingerprint: str
    group: str
    generation: int
    blocks: int
    min_time: int
    max_time: int
    record: str = ""
    """The record type the schema describes, for a topic stored per record type (subject name strategies)."""


class PartitionRow(_Row):
    tenant: str
    shard: int
    window_start: int
    window_end: int
    min_time: int
    max_time: int
    blocks: int


def encode_meta(meta: BlockMeta) -> bytes:
    # Plain JSON: compressing it costs more time per write than the space it saves is worth here.
    return meta.to_json()


def decode_meta(blob: bytes) -> BlockMeta:
    return BlockMeta.model_validate_json(blob)
