"""Commands: typed, versioned records of every change to the metastore's state.

Each command is a pydantic model with a literal ``kind``; it crosses the wire (and the Raft log) as our own
bytes, JSON or msgpack, never as a pickle of a client object. ``decode`` refuses unknown kinds and versions.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar, Literal, get_args

import msgpack
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    ValidationError,
    field_serializer,
    field_validator,
)

from shale.block import (
    INCARNATION_PATTERN,
    RESTORE_JOB_PATTERN,
    BlockMeta,
    pack_counted_ranges,
    packed_or_list,
    unpack_counted_ranges,
)
from shale.compaction import AssignJob, JobUpdate, NewJob
from shale.errors import CommandRejectedError


class _Command(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    version: Literal[1] = 1
    from_clients: ClassVar[bool] = False
    """Whether clients may send this command through the API; the others are proposed by the metastore itself."""


class OffsetRange(BaseModel):
    """The exact offsets ``[start, end)`` of one topic-partition that a batch read, of one topic incarnation.
    ``stored`` counts the records stored from it (records and quarantined); the other offsets of the range held no
    readable record (transaction markers, aborted records, offsets removed by log compaction) and are recorded as
    skipped."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    topic: str
    partition: int = Field(ge=0)
    start: int = Field(ge=0)
    end: int = Field(ge=0)
    incarnation: str = Field(default="", pattern=INCARNATION_PATTERN)
    stored: int | None = Field(default=None, ge=0, description="records stored from the range (None: not counted)")
    bytes: int | None = Field(default=None, ge=0, description=(
        "bytes the range's records took in the batch's blocks (None: not counted): the partition's load, which "
        "places partitions on shards when the group's shard count changes"))


class PartitionKey(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    tenant: str
    shard: int
    window_start: int


class Noop(_Command):
    """Changes nothing. Committing one proves leadership (the read barrier of linearizable reads)."""

    from_clients = True

    kind: Literal["Noop"] = "Noop"


class AddBlocks(_Command):
    """Add blocks to the index. A block that was already compacted or deleted (tombstoned) is rejected; a block
    already present is left as it is."""

    from_clients = True

    kind: Literal["AddBlocks"] = "AddBlocks"
    blocks: list[BlockMeta]


class CommitIngestBatch(_Command):
    """Atomically add one batch's blocks and advance its committed offsets. Accepted only when every range
    starts at its partition's committed end, or when the whole batch is an exact replay (a no-op). An empty range
    ``[s, s)`` records a partition never committed before at ``s`` (one that never held a record: restore counts
    a topic's partitions from the committed ones) and is otherwise ignored."""

    from_clients = True

    kind: Literal["CommitIngestBatch"] = "CommitIngestBatch"
    group: str
    generation: int = 1
    batch: str = Field(default="", description="the writer's batch id, for logs")
    writer: Literal["ingest", "reprocess"] = Field(
        default="ingest", description="live ingestion or a reprocess job: one generation has one kind of writer")
    ranges: list[OffsetRange]
    blocks: list[BlockMeta]
    shard: int = Field(default=0, ge=0, description="the shard of the group whose lease the writer holds")
    lease: int | None = Field(default=None, ge=1, description=(
        "the fencing token of the writer's ingest lease on (group, generation, shard); required once the shard "
        "has ever been leased (only writers that never lease, such as reprocess jobs, send none)"))

    @field_validator("ranges", mode="before")
    @classmethod
    def _unpack_ranges(cls, value: object) -> object:
        # The packed form (shale.block.packed) of a batch of many partitions; the list form is read as before.
        return unpack_counted_ranges(value, OffsetRange) if isinstance(value, str) else value

    @field_serializer("ranges", mode="wrap", when_used="json")
    def _pack_ranges(self, value: list[OffsetRange], handler: SerializerFunctionWrapHandler,
                     info: SerializationInfo) -> object:
        return packed_or_list(value, pack_counted_ranges, handler, info)


class IngestLeaseCommand(_Command):
    """One shard of an ingest group's generation, and the driver process (``holder``) that wants or holds it."""

    from_clients = True

    group: str
    generation: int = Field(default=1, ge=0)
    shard: int = Field(default=0, ge=0)
    holder: str = Field(min_length=1, max_length=200)


class AcquireIngestLease(IngestLeaseCommand):
    """Take the shard's ingest lease for ``duration_ms`` of log time. Granted when the shard has no lease, when its
    lease has expired or been released, or to its current holder (a retry: the same token, extended); otherwise
    answered ``granted: false`` with the holder and its expiry. A new lease's fencing token is this entry's log
    index."""

    kind: Literal["AcquireIngestLease"] = "AcquireIngestLease"
    duration_ms: int = Field(ge=1000, le=3_600_000)
    shards: int = Field(default=1, ge=1, le=1024, description=(
        "the driver's ingest.shards: seeds the group's shard map if it has none (the map rules once it exists)"))
    auto: bool = Field(default=False, description=(
        "ingest.shards = auto: the shard count follows the group's live drivers (a driver that finds every shard "
        "held grows the map by one and takes the new shard; vacant shards shrink it)"))


class RenewIngestLease(IngestLeaseCommand):
    """Extend the holder's unexpired lease by ``duration_ms`` from this entry's time (a heartbeat)."""

    kind: Literal["RenewIngestLease"] = "RenewIngestLease"
    token: int = Field(ge=1)
    duration_ms: int = Field(ge=1000, le=3_600_000)
    auto: bool = Field(default=False, description=(
        "ingest.shards = auto: a renewal that finds shards of the map vacant shrinks the map (its answer's version "
        "is then above the token: the driver acquires a shard again)"))


class ReleaseIngestLease(IngestLeaseCommand):
    """Give the lease up at once (a driver that stops), so a standby takes over without waiting for expiry."""

    kind: Literal["ReleaseIngestLease"] = "ReleaseIngestLease"
    token: int = Field(ge=1)


class SetIngestShards(_Command):
    """Change the shard count of an ingest group's generation (online): the map's version becomes this entry's log
    index, every lease granted before it stops holding its shard (``resharded``), and drivers acquire shards again
    under the new map; a partition that moves resumes at its committed end. Needs admin."""

    from_clients = True

    kind: Literal["SetIngestShards"] = "SetIngestShards"
    group: str
    generation: int = Field(default=1, ge=0)
    shards: int = Field(ge=1, le=1024)


class RecordRestore(_Command):
    """A run of ``shale restore`` starts (``running``) or ends (``done``, or ``stopped`` when a partition stopped):
    who ran it, what it restores, when, and with what result; the audit record of writes into Kafka. ``by`` is
    the caller's token name, set by the API from the request (what a client sends there is replaced); embedded,
    the local user. A new run of a job ends that job's runs left ``running`` (killed) as ``interrupted``. Needs
    admin."""

    from_clients = True

    kind: Literal["RecordRestore"] = "RecordRestore"
    run: str = Field(pattern=r"^[0-9a-f]{16}$")
    job: str = Field(pattern=RESTORE_JOB_PATTERN)
    state: Literal["running", "done", "stopped"]
    by: str = Field(default="", max_length=200)
    tenant: str = Field(max_length=200)
    topic: str = Field(max_length=249)
    incarnation: str = Field(default="", pattern=INCARNATION_PATTERN)
    target: str = Field(max_length=1000, description="the target cluster's bootstrap servers and topic")
    range: str = Field(max_length=2000, description="the range restored, as the plan says it")
    records: int = Field(default=0, ge=0, description="records planned (running) or restored (at the end)")
    message: str = Field(default="", max_length=2000, description="why partitions stopped, when some did")


class ErasureWatermark(BaseModel):
    """A partition's high watermark when an erasure was requested, of one topic incarnation: its records at or
    after ``end`` are new data, not part of the request (``shale.metastore.rules.erasures.Watermarks`` says which
    records are new). ``older``: an incarnation the index held other than the one Kafka named, every record of
    which was produced before the request (``end`` is the index's highest end of it then, for the record).
    ``incarnation`` '': in a request of a release that did not record it, an ``end`` that applies to every
    incarnation; in a later one, ranges of blocks that could not tell their incarnation."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    topic: str = Field(max_length=249)
    partition: int = Field(ge=0)
    end: int = Field(ge=0)
    incarnation: str = Field(default="", pattern=INCARNATION_PATTERN)
    older: bool = False


class ErasedPosition(BaseModel):
    """One Kafka record an erasure removes: (topic, partition, offset) of one topic incarnation ('' = any: the
    block that held it could not tell)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    topic: str = Field(max_length=249)
    partition: int = Field(ge=0)
    offset: int = Field(ge=0)
    incarnation: str = Field(default="", pattern=INCARNATION_PATTERN)


class RequestErasure(_Command):
    """``shale erase``: erase every record of one tenant whose key has SHA-256 ``key_sha256`` (or is ``key``, base64
    of the key's bytes, as requests of releases before 2026-12-04 named it), or whose
    typed ``column`` holds the value of SHA-256 ``value_sha256``, from
    ``topics`` (empty: all of the tenant's topics), of the records Kafka held when it was asked, or without Kafka
    the index held (``watermarks``, naming every partition and topic incarnation the request knew: ``unnamed``).
    ``id`` is derived from tenant, topics, key and ``round`` (``shale.metastore.rules.erasures.erasure_id``): the same
    command again is a no-op that answers with the first; the same request made again once its erasure is past
    ``requested`` is the next round, a new erasure (refused while the round before is still ``requested``).
    ``by`` is set by the API from the caller's token. Needs admin."""

    from_clients = True

    kind: Literal["RequestErasure"] = "RequestErasure"
    id: str = Field(pattern=r"^[0-9a-f]{16}$")
    round: int = Field(default=0, ge=0, le=1_000_000, description="how many times the same request was made "
                       "before, each past requested (0: the first; part of the id)")
    by: str = Field(default="", max_length=200)
    tenant: str = Field(max_length=200)
    topics: list[str] = Field(default_factory=list, max_length=10_000)
    key: str = Field(default="", max_length=1_400_000, description="the record key's bytes, base64 ('' with "
                     "column or key_sha256: requests of releases before 2026-12-04 carry it)")
    key_sha256: str = Field(default="", pattern=r"^([0-9a-f]{64})?$", description="the SHA-256 of the record "
                            "key's bytes, in place of key: what the erasure matches, so no log entry holds the key")
    column: str = Field(default="", max_length=1000, description="erase by a typed column's value instead of a "
                        "key: the column's path in the partition group (customer.id)")
    value_sha256: str = Field(default="", pattern=r"^([0-9a-f]{64}(,[0-9a-f]{64}){0,7})?$", description="with "
                              "column: the SHA-256 of the value's canonical form (shale.erase.column), never the "
                              "value; one per kind, sorted and comma-separated, when the column's types differ in "
                              "kind")
    watermarks: list[ErasureWatermark] = Field(default_factory=list)
    unnamed: Literal["older", "later"] = Field(default="older", description="what a record of a partition or "
                                               "topic incarnation the watermarks do not name is: later (new data; "
                                               "the watermarks name every one the request knew, from Kafka and "
                                               "the index) or older (part of the request: an earlier release's "
                                               "request, whose watermarks name Kafka's incarnation only)")
    delete_delay_ms: int = Field(default=0, ge=0, description="a shorter delete delay for the replaced blocks' "
                                 "objects (ms; 0: block.delete_delay); the leader never goes below its floor "
                                 "(shale.erase.delete_delay_floor)")


class PlanErasure(_Command):
    """The records an erasure removes, as found in the backup group (``positions``): every indexed block of
    either group, any generation, that holds one of them gets an erase job (a compaction job kind), and so does
    every block added later that holds one (compaction outputs of blocks not rewritten yet, a new generation
    read from Kafka). Applies once per erasure: a second plan is a no-op. Needs admin."""

    from_clients = True

    kind: Literal["PlanErasure"] = "PlanErasure"
    id: str = Field(pattern=r"^[0-9a-f]{16}$")
    positions: list[ErasedPosition] = Field(default_factory=list)


class RecordErasureReceipt(_Command):
    """An erasure's receipt is in the bucket (``key``, written once): the erasure is ``done``. Needs admin."""

    from_clients = True

    kind: Literal["RecordErasureReceipt"] = "RecordErasureReceipt"
    id: str = Field(pattern=r"^[0-9a-f]{16}$")
    key: str = Field(max_length=1000)


class AcknowledgeOffsetLoss(_Command):
    """An operator accepts that offsets ``[start, end)`` of one topic-partition are lost (Kafka deleted them before
    they were read): the committed end moves from ``start`` to ``end`` and the loss is recorded. Accepted only when
    ``start`` is the partition's committed end in that incarnation."""

    from_clients = True

    kind: Literal["AcknowledgeOffsetLoss"] = "AcknowledgeOffsetLoss"
    group: str
    generation: int = Field(ge=0)
    topic: str
    partition: int = Field(ge=0)
    incarnation: str = Field(default="", pattern=INCARNATION_PATTERN)
    start: int = Field(ge=0)
    end: int = Field(ge=0)
    reason: str = Field(default="", max_length=500)


class ReplaceBlocks(_Command):
    """Atomically replace ``sources`` by ``blocks`` and tombstone the sources (compaction)."""

    from_clients = True

    kind: Literal["ReplaceBlocks"] = "ReplaceBlocks"
    tenant: str
    sources: list[str]
    blocks: list[BlockMeta]
    reason: str = "compacted"


class QuarantineBlocks(_Command):
    """Remove damaged blocks from the index *without* tombstones (``shale bucket repair``): readers stop seeing
    them, and their objects stay in the bucket under a quarantine mark, which nothing deletes. A block not in the
    index is left alone (idempotent)."""

    kind: Literal["QuarantineBlocks"] = "QuarantineBlocks"
    from_clients = True
    tenant: str
    block_ids: list[str]
    reason: str = Field(default="", max_length=2000)


class TruncateIndex(_Command):
    """Retention: remove the expired blocks of ``partitions`` and tombstone them. ``cutoffs`` holds, per tenant,
    the time (ms) computed when the leader prepared the command: a block is expired when its creation window and
    its data (``max_time``) both end at or before its tenant's cutoff. The apply checks every block again, so a
    block added to the partition meanwhile (a compaction output holding fresh records in an old creation window)
    stays. Rejected if leadership changed since the leader prepared it (``prepared_term`` must equal the log
    entry's term)."""

    kind: Literal["TruncateIndex"] = "TruncateIndex"
    prepared_term: int
    partitions: list[PartitionKey]
    cutoffs: dict[str, int]
    reason: str = "retention"


class DeleteTombstones(_Command):
    """Forget tombstones whose objects have been deleted from the bucket."""

    from_clients = True

    kind: Literal["DeleteTombstones"] = "DeleteTombstones"
    block_ids: list[str]


class SetActiveGeneration(_Command):
    """Make ``generation`` the one readers see for a tenant's topic over data time ``[start, end]`` (seed 002's
    reversible parser bugs). With ``retire``, partition-group blocks of other generations that lie wholly in the
    range are tombstoned (their objects go after the delete delay)."""

    from_clients = True

    kind: Literal["SetActiveGeneration"] = "SetActiveGeneration"
    tenant: str
    topic: str
    generation: int = Field(ge=0)
    start: int
    end: int
    retire: bool = False


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class UpdateCompactionPlan(_Command):
    kind: Literal["UpdateCompactionPlan"] = "UpdateCompactionPlan"
    prepared_term: int
    worker: str
    request: str = ""
    lease_ms: int
    updates: list[JobUpdate] = Field(default_factory=list)
    new_jobs: list[NewJob] = Field(default_factory=list)
    assign: list[AssignJob] = Field(default_factory=list)
    evict: list[str] = Field(default_factory=list)


class SetCompactionFailureLimit(_Command):
    """Raise (or lower) the failures after which a job is excluded (seed 003's admin action)."""

    from_clients = True

    kind: Literal["SetCompactionFailureLimit"] = "SetCompactionFailureLimit"
    limit: int = Field(ge=1)


class TrimBlockChanges(_Command):
    """Forget the change feed (``shale.index.changes``) up to log index ``through``: its consumer (the Iceberg
    publisher) has published every change up to there."""

    kind: Literal["TrimBlockChanges"] = "TrimBlockChanges"
    through: int = Field(ge=0)


Command = Annotated[Noop | AddBlocks | CommitIngestBatch | ReplaceBlocks | TruncateIndex | DeleteTombstones
                    | UpdateCompactionPlan | SetCompactionFailureLimit | SetActiveGeneration | AcknowledgeOffsetLoss
                    | TrimBlockChanges | QuarantineBlocks | AcquireIngestLease | RenewIngestLease | ReleaseIngestLease
                    | SetIngestShards | RecordRestore | RequestErasure | PlanErasure
                    | RecordErasureReceipt,
                    Field(discriminator="kind")]
"""Every command, declared once: the kinds, the decoder, the API's list of client commands and the state
machine's handler registry (checked complete at import) all derive from this union."""
_ADAPTER: TypeAdapter[Command] = TypeAdapter(Command)
COMMAND_TYPES: tuple[type[_Command], ...] = get_args(get_args(Command)[0])
COMMAND_KINDS = tuple(str(c.model_fields["kind"].default) for c in COMMAND_TYPES)
CLIENT_COMMANDS = frozenset(str(c.model_fields["kind"].default) for c in COMMAND_TYPES if c.from_clients)


class Result(BaseModel):
    """What applying a command produced. A rejection is a result too: deterministic on every replica."""

    model_config = ConfigDict(frozen=True)
    ok: bool
    reason: str = ""
    message: str = ""
    data: dict[str, Any] = Field(default_factory=dict)

    def raise_for_rejection(self) -> Result:
        if not self.ok:
            raise CommandRejectedError(self.message, reason=self.reason)
        return self


def encode(command: Command, fmt: str = "json") -> bytes:
    """Bytes of a command: JSON (``{``...) or msgpack (a map, first byte 0x8_ or 0xde/0xdf)."""
    if fmt == "msgpack":
        packed: bytes = msgpack.packb(command.model_dump(mode="json"))
        return packed
    return command.model_dump_json().encode()


def decode(data: bytes) -> Command:
    """The command in ``data`` (JSON or msgpack); a ``CommandRejectedError`` if it is not a known command."""
    if data[:1] == b"{":
        try:
            return _ADAPTER.validate_json(data)  # parsed in pydantic's Rust core, the fast path
        except ValidationError as exc:
            first = exc
        try:
            raw = json.loads(data)
        except ValueError as err:
            raise CommandRejectedError(f"command is not valid JSON: {err}", reason="malformed") from None
    else:
        try:
            raw = msgpack.unpackb(data)
        except (ValueError, msgpack.UnpackException) as err:
            raise CommandRejectedError(f"command is neither JSON nor msgpack: {err}", reason="malformed") from None
        try:
            _check_kind(raw)
            return _ADAPTER.validate_python(raw)
        except ValidationError as exc:
            first = exc
    _check_kind(raw)
    error = first.errors()[0]
    raise CommandRejectedError(f"invalid {raw['kind']}: {error['msg']} at {'.'.join(str(p) for p in error['loc'])}",
                               reason="malformed")


def _check_kind(raw: object) -> None:
    if not isinstance(raw, dict) or raw.get("kind") not in COMMAND_KINDS:
        kind = raw.get("kind") if isinstance(raw, dict) else None
        raise CommandRejectedError(f"unknown command kind {kind!r}; known: {', '.join(COMMAND_KINDS)}",
                                   reason="unknown-command")
    if raw.get("version", 1) != 1:
        raise CommandRejectedError(f"{raw['kind']} version {raw['version']} is not supported by this metastore; "
                                   "upgrade it before its clients", reason="unknown-version")
