"""What crosses the Spark boundary between a reprocess run and its partition tasks, encoded and decoded here
alone, one function per direction.

Into a task: the round's ``RoundSpec`` (the same for every task of the round) and the task's ``PartitionWork`` (a
partition's offset range and the backup blocks that hold it). Out of it: the chunks it wrote (``Written``, in
``shale.encoder.encode_written``'s encoding, as ingest's tasks return them). All
three cross as JSON, so Spark pickles nothing of Shale's but the bucket's and the Schema Registry's
configurations: JSON masks secrets (the ``ingest`` in the spec holds the registry's password as asterisks), so
the task takes the pickled registry configuration instead of the spec's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import TypeAdapter

from shale.block import BlockMeta
from shale.config import IngestConfig
from shale.ingest import PartitionRange
from shale.schemas import KnownSchemas


@dataclass(frozen=True)
class RoundSpec:
    """What every task of a round shares."""

    read_time_ms: int
    """The round's read time (the blocks' ingest time)."""
    generation: int
    """The partition-group generation written."""
    ingest: IngestConfig
    """The ingest configuration with the run's parser as the only rule."""
    task_bytes: int
    """``ingest.max_task_bytes`` of the configuration: a task's memory budget sizes its chunks."""
    known: KnownSchemas = field(default_factory=KnownSchemas)
    """The named reader schema and the schemas it references, read by the driver: each task remembers them."""


@dataclass(frozen=True)
class PartitionWork:
    """One task's work: a partition's offsets ``[start, end)`` and the backup blocks that hold them."""

    range: PartitionRange
    blocks: tuple[BlockMeta, ...]


_SPEC = TypeAdapter(RoundSpec)
_WORK = TypeAdapter(PartitionWork)


def encode_spec(spec: RoundSpec) -> str:
    return _SPEC.dump_json(spec).decode()


def decode_spec(text: str) -> RoundSpec:
    return _SPEC.validate_json(text)


def encode_work(work: PartitionWork) -> str:
    return _WORK.dump_json(work).decode()


def decode_work(text: str) -> PartitionWork:
    return _WORK.validate_json(text)
