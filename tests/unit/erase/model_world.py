"""The world the erasure model (``test_erase_model.py``) runs in: its records and how each group's blocks hold
them, the commit an ingest driver sends for a block, and the faults it injects into the metastore as a client sees
it (an erase driver killed before its plan, a driver cut off from the metastore at its commit)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from tests.factories import BASE_MS

from shale.block import BlockMeta, BlockSpec, DatasetInput, KafkaRange, deterministic_block_id, write_block
from shale.block.schemas import BACKUP_SCHEMA, QUARANTINE_SCHEMA, partition_schema
from shale.config import BucketConfig
from shale.errors import MetastoreUnavailableError
from shale.metastore import CommitIngestBatch, MetastoreService, OffsetRange, PlanErasure
from shale.objstore import Bucket
from shale.restore.task import PartitionWork, _dead_letter

TOPIC = "app"
PARTITIONS = (0, 1)
KEYS = (b"k0", b"k1", b"k1\n")
"""Three keys, one the prefix of another (a match is by the whole key's hash, never a prefix)."""
CUSTOMERS = (0, 1, 2)
"""The values of the partition group's typed column ``customer.id`` (and null), erased by column."""
COLUMN = "customer.id"
CUSTOMER_TYPE = pa.struct([("id", pa.int64())])

Record = tuple[int, int, str]
"""A record's position: partition, offset, incarnation."""


def value_of(partition: int, offset: int, incarnation: str) -> bytes:
    """Unique per record across incarnations (a copy of another record's value would be seen); it names the
    record's customer, which the partition group's parser types as ``customer.id``."""
    customer = customer_of((partition, offset, incarnation))
    return (f'{{"p": {partition}, "o": {offset}, "customer": {{"id": {"null" if customer is None else customer}}}, '
            f'"i": "{incarnation}"}}').encode()


def incarnation_of(value: bytes) -> str:
    return value.decode().rsplit('"i": "', 1)[1][:-2]


def customer_of(record: Record) -> int | None:
    """A record's ``customer.id``: drawn from its position (the keys are drawn apart), null one time in four."""
    partition, offset, incarnation = record
    n = (offset * 7 + partition * 3 + ord(incarnation[0])) % 4
    return None if n == 3 else CUSTOMERS[n]


def parsed(record: Record) -> bool:
    """Whether the partition group's parser types the record (every third offset it quarantines: no typed column,
    so an erasure by column never matches it)."""
    return record[1] % 3 != 0


def write(bucket: Bucket, group: str, partition: int, start: int, keys: list[bytes], incarnation: str,
          generation: int = 1) -> BlockMeta:
    """A level-0 block of ``group`` holding app[partition]@[start, start+len(keys)) of ``incarnation``: the backup
    group's records as they are; the partition group's parsed into ``customer`` (a struct with ``id``), every third
    offset quarantined."""
    count = len(keys)
    offsets = list(range(start, start + count))
    table = pa.table({
        "topic": pa.array([TOPIC] * count),
        "partition": pa.array([partition] * count, pa.int32()),
        "offset": pa.array(offsets, pa.int64()),
        "timestamp": pa.array([BASE_MS + o * 1000 for o in offsets], pa.timestamp("ms", tz="UTC")),
        "timestamp_type": pa.array([0] * count, pa.int8()),
        "key": pa.array(keys, pa.binary()),
        "value": pa.array([value_of(partition, o, incarnation) for o in offsets], pa.binary()),
        "headers": pa.array([[]] * count, BACKUP_SCHEMA.field("headers").type),
    }, schema=BACKUP_SCHEMA)
    block_id = deterministic_block_id(BASE_MS + start * 1000,
                                      f"{group}/{generation}/{incarnation}/{partition}/{start}")
    spec = BlockSpec(id=block_id, tenant="acme", group=group, generation=generation, kafka=[
        KafkaRange(topic=TOPIC, partition=partition, start=start, end=start + count, incarnation=incarnation)])
    labels = [{"topic": TOPIC}]
    if group == "backup":
        return write_block(bucket, spec, [DatasetInput("records", TOPIC, table, "timestamp", labels=labels)])
    good = pa.array([parsed((partition, o, incarnation)) for o in offsets])
    rows = table.filter(good)
    customers = [customer_of((partition, o, incarnation)) for o in rows.column("offset").to_pylist()]
    rows = rows.append_column("event_time", rows.column("timestamp").cast(pa.timestamp("us", tz="UTC")))
    rows = rows.append_column("dt", pa.array(["2026-11-18"] * rows.num_rows))
    rows = rows.append_column("hour", pa.array([None] * rows.num_rows, pa.int8()))
    rows = rows.append_column("customer", pa.array([None if c is None else {"id": c} for c in customers],
                                                   CUSTOMER_TYPE))
    refused = table.filter(pc.invert(good))
    refused = refused.append_column("reason", pa.array(["test"] * refused.num_rows))
    refused = refused.append_column("parser", pa.array(["json"] * refused.num_rows))
    spec.partition_values = {"dt": "2026-11-18"}
    schema = partition_schema(["customer"], {"customer": CUSTOMER_TYPE})
    return write_block(bucket, spec, [
        DatasetInput("records", TOPIC, rows.cast(schema), "event_time", labels=labels),
        DatasetInput("quarantine", TOPIC, refused.cast(QUARANTINE_SCHEMA), "timestamp", labels=labels)])


def commit_of(block: BlockMeta, batch: str) -> CommitIngestBatch:
    """The commit an ingest driver sends for a batch that wrote ``block`` (one partition's range, every record
    stored)."""
    (r,) = block.kafka
    return CommitIngestBatch(group=block.group, generation=block.generation, batch=batch, blocks=[block],
                             ranges=[OffsetRange(topic=r.topic, partition=r.partition, start=r.start, end=r.end,
                                                 incarnation=r.incarnation, stored=r.end - r.start)])


class KilledError(RuntimeError):
    """The erase driver killed between its request and its plan."""


class KilledBeforePlan:
    """The metastore as an erase driver sees it, dying when it submits its plan."""

    def __init__(self, service: MetastoreService) -> None:
        self._service = service

    def __getattr__(self, name: str) -> Any:
        return getattr(self._service, name)

    def submit(self, command: Any) -> Any:
        if isinstance(command, PlanErasure):
            raise KilledError("killed before PlanErasure")
        return self._service.submit(command)


class CutOff:
    """The metastore as an ingest driver sees it: unreachable while ``down`` (a network partition, a leader
    election), every command then failing as the HTTP client fails."""

    def __init__(self, service: MetastoreService) -> None:
        self._service = service
        self.down = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._service, name)

    def submit(self, command: Any) -> Any:
        if self.down:
            raise MetastoreUnavailableError("the metastore is unreachable (the model's outage)")
        return self._service.submit(command)


def records_in(table: pa.Table, produced: dict[Record, bytes]) -> list[Record]:
    """The records a block's dataset holds, each checked as written: its key, its value byte for byte and, where
    the dataset has the typed column, its ``customer.id``."""
    customers = pc.struct_field(table.column("customer"), "id").to_pylist() if "customer" in table.column_names \
        else [None] * table.num_rows
    out = []
    for p, o, key, value, customer in zip(table.column("partition").to_pylist(), table.column("offset").to_pylist(),
                                          table.column("key").to_pylist(), table.column("value").to_pylist(),
                                          customers, strict=True):
        record = (p, o, incarnation_of(value))
        assert (key, value) == (produced[record], value_of(*record)), record
        assert "customer" not in table.column_names or customer == customer_of(record), record
        out.append(record)
    return out


def restore_dead_letter(bucket: BucketConfig, record: Record, key: bytes, job: str) -> str:
    """A restore's dead letter of ``record`` (its target refused it: too large), key and value verbatim; its key."""
    partition, offset, incarnation = record
    work = PartitionWork(job=job, topic=TOPIC, target_topic=f"{TOPIC}-back", partition=partition, start=0,
                         end=offset + 1, intervals=(), source_partitions=2, target_partitions=2, until_ms=None,
                         commit_every=100, tenant="acme", max_message_bytes=10, dead_letter=True,
                         incarnation=incarnation)
    return _dead_letter(bucket, work, "b", offset, 99, key, value_of(*record), [], 1_000)
