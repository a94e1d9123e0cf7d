"""``shale erase``'s driver, also the Python API: commit the request, find its records, plan the rewrites.

1. ``RequestErasure`` is committed first: who, when, the tenant, the topics, the key, and every partition and
   topic incarnation it knows: each partition's high watermark of the incarnation Kafka reports now, and every
   older incarnation the index holds (without Kafka, each incarnation's highest end the index holds). Records
   produced later, and records of an incarnation it does not name (the topic recreated), are new data, not part
   of the request (``request_watermarks``). The id is derived from tenant, topics, key and round: the same
   request again, once the one before is past ``requested``, is the next round (a new erasure with its own
   watermarks).
2. The backup group is scanned for the key (``shale.erase.scan``), below those watermarks (each bounds its own
   incarnation: ``shale.metastore.Watermarks``); for an erasure by a typed column's value, the partition group is
   scanned for the value's hash instead (``shale.erase.column``). The scan waits until the scanned group has
   committed every partition up to its watermark (``unindexed``): a record below a watermark that is not in the
   index yet (its group's ingest lags, or its commit waits in the dead letter queue) would otherwise be missed by
   the scan and found by the receipt's final scan. Past ``wait`` seconds, nothing is committed
   (``ErasureNotReadyError``): the same command again takes newer watermarks and waits for them.
3. ``PlanErasure`` records the positions found; the metastore gives every block of either group that holds one an
   erase job, which the compaction workers run under their leases and fencing tokens (DESIGN 19).

Killed between 1 and 3, the same request again finds its round in state ``requested`` and scans with its
watermarks. A dry run commits nothing and reads the index and the bucket only (it always scans, with the
watermarks the run would use).
"""

from __future__ import annotations

import base64
import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from shale.block import DLQ_PREFIX, BlockMeta
from shale.compactor import erased_rows
from shale.config import BucketConfig, KafkaConfig, ShaleConfig
from shale.erase.column import request_hash
from shale.erase.scan import Position, ScanResult, column_datasets, find_column_matches, find_matches, read_rows
from shale.erase.times import iso_ms
from shale.errors import ShaleError
from shale.metastore import (
    Commands,
    DeadLetterQueue,
    ErasedPosition,
    ErasureReads,
    ErasureWatermark,
    OffsetReads,
    PlanErasure,
    Queued,
    RequestErasure,
    TenantBlocks,
    Watermarks,
    erasure_id,
)
from shale.objstore import Bucket, BucketReader, open_bucket

GROUPS = ("backup", "partition")


class ErasureNotReadyError(ShaleError):
    """The scanned group has not committed every partition up to the request's watermarks yet (its ingest lags,
    or its commits wait in the dead letter queue): nothing of the request was committed; run it again."""


class ErasureMetastore(TenantBlocks, ErasureReads, OffsetReads, Protocol):
    """What an erasure reads (any view) and, unless a dry run, writes (``open_metastore`` fits)."""


class ErasureWriter(ErasureMetastore, Commands, Protocol):
    """An erasure's metastore when it writes."""


@dataclass(frozen=True)
class ErasureRequest:
    tenant: str
    key: bytes = b""
    topics: Sequence[str] = ()
    """Empty: every topic of the tenant."""
    column: str = ""
    """Erase by a typed column's value instead of a key: the column's path in the partition group (``customer.id``)."""
    value_sha256: str = ""
    """With ``column``: the SHA-256 of the value's canonical form (``column_request`` computes it)."""
    delete_delay: float = 0.0
    """A shorter delete delay for the replaced blocks' objects, in seconds (0: ``block.delete_delay``). Not part of
    the request's identity: a resumed request keeps the one it was made with. ``check_delete_delay`` says whether a
    configuration allows it; the metastore leader never goes below its own floor."""

    @property
    def id(self) -> str:
        """The request's first erasure's id (``id_at(0)``)."""
        return self.id_at(0)

    @property
    def key_sha256(self) -> str:
        """What a request by key sends in place of the key (``RequestErasure.key_sha256``); '' by column."""
        return "" if self.column else hashlib.sha256(self.key).hexdigest()

    def id_at(self, round_: int) -> str:
        """The id of the request's erasure ``round_`` (0: the first; each later one a request made again once the
        one before was past ``requested``)."""
        return erasure_id(self.tenant, self.topics, b"" if self.column else self.key, self.column,
                          self.value_sha256, round_, self.key_sha256)

    def legacy_id_at(self, round_: int) -> str:
        """The id a release before 2026-12-04 gave round ``round_`` of a request by key (named by the key itself;
        the same as ``id_at`` by column)."""
        return erasure_id(self.tenant, self.topics, self.key, self.column, self.value_sha256, round_)


def check_delete_delay(config: ShaleConfig, seconds: float) -> float:
    """``seconds`` if an erasure may ask for that delete delay under ``config``: at least the floor
    (``ShaleConfig.erasure_delay_floor``: readers may use an index that old) and below ``block.delete_delay`` (it
    is a shorter delay). Otherwise a ``ValueError`` that names the bounds."""
    floor, default = config.erasure_delay_floor, config.block.delete_delay
    if not floor <= seconds <= default:
        raise ValueError(
            f"an erasure's delete delay must be between {floor:g} s and block.delete_delay ({default:g} s), not "
            f"{seconds:g} s: readers may use a bucket index bucket_index.max_stale_period old "
            f"({config.bucket_index.max_stale_period:g} s), bucket scanners trust no block younger than "
            f"block.sync_delay ({config.block.sync_delay:g} s) and an index query runs up to metastore.query_timeout "
            f"({config.metastore.query_timeout:g} s); a replaced block's objects must outlive all three")
    return seconds


def column_request(metastore: ErasureMetastore, tenant: str, column: str, value: str,
                   topics: Sequence[str] = ()) -> ErasureRequest:
    """The request to erase every record of ``tenant`` whose ``column`` holds ``value`` (text, read as the type the
    column has in the partition group's datasets of ``topics``: ``shale.erase.column``). A value that is not one of
    that type, or a column no dataset in scope has, is a ``ColumnValueError``; the request keeps only the hash."""
    wanted = set(topics)
    types = {t for b in metastore.tenant_blocks(tenant) if b.group == "partition"
             for _, t in column_datasets(b, column, wanted)}
    return ErasureRequest(tenant=tenant, topics=topics, column=column,
                          value_sha256=request_hash(value, types, column))


@dataclass
class ErasureReport:
    id: str
    dry_run: bool
    state: str
    replay: bool = False
    """Another run made this erasure meanwhile and got past ``requested``: this report is its."""
    previous: str = ""
    """The erasure of the same request this one follows (made again: its own watermarks), if any."""
    by: str = ""
    requested_at: int = 0
    watermarks: list[dict[str, Any]] = field(default_factory=list)
    unnamed: str = "later"
    """What a record of a partition or topic incarnation the watermarks do not name is (``Watermarks``): ``later``
    (new data), or ``older`` (the request's: a request of an earlier release)."""
    records: list[dict[str, Any]] = field(default_factory=list)
    """The matching records (one per position; ``copies``: backup blocks holding it)."""
    blocks: list[dict[str, Any]] = field(default_factory=list)
    """The blocks to rewrite (or being rewritten)."""
    matches: int = 0
    """Positions (records) found."""
    rows_to_remove: dict[str, int] = field(default_factory=dict)
    """Per group (``backup``, ``partition``), the rows the rewrites remove: a record's every copy (the backup
    group may hold one in several blocks; the partition group holds it as a record or quarantined, or not at all),
    counted as the erase job counts them. A dry run's and a run's own figures (a status report has none)."""
    rows_removed: dict[str, int] = field(default_factory=dict)
    """Per group, the rows the blocks rewritten so far removed (a status report's figures; a dry run has none)."""
    blocks_total: int = 0
    blocks_opened: int = 0
    jobs: list[str] = field(default_factory=list)
    undecided: list[dict[str, Any]] = field(default_factory=list)
    """Records of the key at or past a watermark whose incarnation their block cannot tell: not erased
    (``shale.metastore.Watermarks``); ``--no-kafka`` erases them, with every other record of the key."""
    delete_delay: float = 0.0
    """The delete delay asked for the replaced blocks' objects, in seconds (0: ``block.delete_delay``)."""
    unindexed: list[dict[str, Any]] = field(default_factory=list)
    """A dry run's partitions the scanned group has not committed up to their watermarks (``unindexed``): the
    run waits for them before it scans."""

    def to_dict(self) -> dict[str, Any]:
        """Every field, and ``requested_at_iso`` beside ``requested_at`` (epoch milliseconds)."""
        return asdict(self) | {"requested_at_iso": iso_ms(self.requested_at)}


def high_watermarks(kafka: KafkaConfig, topics: Sequence[str]) -> list[ErasureWatermark]:
    """Each partition's end offset now (read_committed) and the topic's incarnation, for the topics Kafka still
    has."""
    from shale.kafka import describe_topics, offset_bounds

    states = {t: s for t, s in describe_topics(kafka, topics).items() if t in set(topics)}
    ends = offset_bounds(kafka, [(t, p) for t, s in states.items() for p in s.partitions]) if states else {}
    return [ErasureWatermark(topic=t, partition=p, end=end, incarnation=states[t].incarnation)
            for (t, p), (_, end) in sorted(ends.items())]


def request_watermarks(blocks: list[BlockMeta], topics: Sequence[str],
                       kafka: list[ErasureWatermark] | None) -> Watermarks:
    """What a new request is bounded by (``Watermarks``): every partition and topic incarnation it knows, so that
    a record of any other is new data. ``kafka``: Kafka's high watermarks of its current incarnations, and each
    other incarnation the index holds (``blocks``) of ``topics`` whole (``older``: produced before), on every
    partition of its topic either knows (its records on a partition the index had none of yet are older too).
    Without Kafka (None: the topics are gone, or Kafka was not asked), each incarnation the index holds, bounded
    by its highest indexed end per partition: the records backed up when the request was made; one ingested
    later is the next round's."""
    indexed: dict[tuple[str, int, str], int] = {}
    wanted = set(topics)
    for block in blocks:
        for r in block.kafka:
            if r.topic in wanted:
                at = (r.topic, r.partition, r.incarnation)
                indexed[at] = max(indexed.get(at, 0), r.end)
    if kafka is None:
        return Watermarks([ErasureWatermark(topic=t, partition=p, end=end, incarnation=i)
                           for (t, p, i), end in sorted(indexed.items())], unnamed="later")
    named = {(m.topic, m.partition, m.incarnation) for m in kafka}
    partitions: dict[str, set[int]] = {}
    for t, p, _ in [*named, *indexed]:
        partitions.setdefault(t, set()).add(p)
    older = {(t, p, i) for t, _, i in indexed if i for p in partitions[t]} | {at for at in indexed if not at[2]}
    return Watermarks([*kafka, *(ErasureWatermark(topic=t, partition=p, end=indexed.get((t, p, i), 0), incarnation=i,
                                                  older=True) for t, p, i in sorted(older - named))],
                      unnamed="later")


def unindexed(metastore: OffsetReads, group: str, marks: Watermarks, topics: Sequence[str],
              queued: Sequence[Queued] = ()) -> list[dict[str, Any]]:
    """Where ``group`` has not indexed every record below ``marks`` of ``topics``: a scan of the index now would
    miss them. A partition the group has not committed up to its watermark (its ingest lags; with the group's
    committed end, the highest of its generations), and a commit of the group in the dead letter queue
    (``queued``) holding offsets the request covers (the metastore was out of reach: its key). A watermark of an
    older incarnation, of a partition incarnation the group has moved past (the topic recreated: the old one's
    commits are final, but for a queued one), or of a topic the group never committed (not ingested: nothing of it
    in the bucket) is never waited for."""
    committed: dict[tuple[str, int], dict[str, int]] = {}
    """Per partition, each incarnation's committed end (one pass: the rows are read once, not per watermark)."""
    for row in metastore.offsets(group):
        ends = committed.setdefault((row.topic, row.partition), {})
        ends[row.incarnation] = max(ends.get(row.incarnation, 0), row.committed_end)
    ingested = {t for t, _ in committed}
    lag: list[dict[str, Any]] = []
    for m in marks.marks:
        current = committed.get((m.topic, m.partition), {})
        moved = bool(m.incarnation) and bool(current) and "" not in current and m.incarnation not in current
        if m.older or m.end <= 0 or m.topic not in ingested or moved:
            continue
        got = max((end for i, end in current.items() if i == m.incarnation or not i or not m.incarnation), default=0)
        if got < m.end:
            lag.append({"topic": m.topic, "partition": m.partition, "incarnation": m.incarnation,
                        "watermark": m.end, "committed": got})
    wanted = set(topics)
    for q in queued:
        if q.command is not None and q.command.group == group and any(
                r.topic in wanted and r.end > r.start
                and not marks.produced_later(r.topic, r.partition, r.start, r.incarnation) for r in q.command.ranges):
            lag.append({"queued": q.key})
    return lag


def lag_text(lag: dict[str, Any]) -> str:
    """One of ``unindexed``'s entries, for people."""
    if "queued" in lag:
        return f"a commit in the dead letter queue ({lag['queued']})"
    return f"{lag['topic']}[{lag['partition']}] committed {lag['committed']} of {lag['watermark']}"


def await_indexed(metastore: OffsetReads, bucket: Bucket, group: str, marks: Watermarks, topics: Sequence[str],
                  wait: float, *, sleep: Callable[[float], None] = time.sleep,
                  clock: Callable[[], float] = time.monotonic) -> None:
    """Return once ``group`` has indexed every record below ``marks`` (``unindexed``), asking every second for up
    to ``wait`` seconds; then an ``ErasureNotReadyError`` naming what is behind."""
    deadline = clock() + wait
    while lag := unindexed(metastore, group, marks, topics, DeadLetterQueue(bucket).queued(DLQ_PREFIX)):
        if clock() >= deadline:
            raise ErasureNotReadyError(
                f"the {group} group has not indexed every record below the request's high watermarks after "
                f"{wait:g} s ({len(lag)} behind: {', '.join(map(lag_text, lag[:10]))}), so a scan now would miss "
                f"them. Nothing was committed. Is the {group} group's ingest running, and the metastore leader "
                "replaying the dead letter queue (`shale metastore status`)? Run the same command again (--wait "
                "SECONDS waits longer)")
        sleep(min(1.0, max(0.0, deadline - clock())))


def _topics(request: ErasureRequest, blocks: list[BlockMeta]) -> list[str]:
    if request.topics:
        return sorted(set(request.topics))
    return sorted({d.topic for b in blocks for d in b.datasets} | {r.topic for b in blocks for r in b.kafka})


def _records(scan: ScanResult) -> list[dict[str, Any]]:
    copies: dict[tuple[str, int, int, str], list[str]] = {}
    times: dict[tuple[str, int, int, str], int] = {}
    for m in scan.matches:
        copies.setdefault(m.position, []).append(m.block)
        times[m.position] = m.timestamp_ms
    return [{"topic": t, "partition": p, "offset": o, "incarnation": i, "timestamp_ms": times[(t, p, o, i)],
             "timestamp_iso": iso_ms(times[(t, p, o, i)]), "copies": sorted(copies[(t, p, o, i)])}
            for (t, p, o, i) in sorted(copies)]


def rows_at(bucket: BucketReader, block: BlockMeta, positions: list[Position]) -> int:
    """The rows of ``block`` at ``positions``, any dataset (records, quarantine, backup): what its erase job removes
    (``shale.compactor.erased_rows``, on the position columns only)."""
    topics = {t for t, _, _, _ in positions}
    total = 0
    for dataset in block.datasets:
        if dataset.rows and dataset.topic in topics:
            table = read_rows(bucket, block, dataset, ["partition", "offset"])
            total += int(erased_rows(block, dataset.topic, table, positions).sum())
    return total


def _blocks(bucket: BucketReader, scan: ScanResult) -> list[dict[str, Any]]:
    positions = scan.positions
    out = []
    for b in scan.affected:
        held = sum(1 for t, p, o, i in positions if any(
            r.topic == t and r.partition == p and r.start <= o < r.end and (not i or not r.incarnation
                                                                          or r.incarnation == i) for r in b.kafka))
        out.append({"id": b.id, "group": b.group, "generation": b.generation, "level": b.level,
                    "positions": held, "rows": b.rows, "rows_to_remove": rows_at(bucket, b, positions)})
    return out


def by_group(blocks: list[dict[str, Any]], field_: str) -> dict[str, int]:
    """``field_`` of ``blocks`` summed per group (each group named, 0 where none)."""
    return {g: sum(int(b[field_]) for b in blocks if b["group"] == g) for g in GROUPS}


def open_round(metastore: ErasureReads, request: ErasureRequest,
               id_at: Callable[[int], str] | None = None) -> tuple[int, dict[str, Any] | None]:
    """The round a run of ``request`` makes or resumes, and that round's row if it was requested: the first round
    still ``requested`` (killed before its plan: resumed with its watermarks), else the round after the last.
    ``id_at`` names the rounds (default ``request.id_at``)."""
    id_at = id_at or request.id_at
    round_ = 0
    while rows := metastore.erasures(id_at(round_)):
        if rows[0]["state"] == "requested":
            return round_, rows[0]
        round_ += 1
    return round_, None


def erase(metastore: ErasureMetastore, bucket: BucketConfig, request: ErasureRequest, *,
          kafka: KafkaConfig | None = None, dry_run: bool = True, by: str = "", wait: float = 120.0,
          sleep: Callable[[float], None] = time.sleep) -> ErasureReport:
    """Erase ``request.key`` (or the records whose ``request.column`` holds the value hashed: ``column_request``)
    from the tenant's blocks (``dry_run``: only say what would be erased). ``kafka`` gives the high watermarks;
    without it (the topic is gone) every record of the key backed up when the request is made is erased
    (``request_watermarks``). A request made again once the
    first is past ``requested`` is a new erasure (its own id and watermarks: the key's records produced since);
    one still ``requested`` (a run killed before its plan) is resumed. Before it commits or scans, it waits up to
    ``wait`` seconds for the scanned group to commit up to the watermarks (``await_indexed``; a dry run reports
    the partitions behind in ``unindexed`` instead)."""
    blocks = metastore.tenant_blocks(request.tenant)
    topics = _topics(request, blocks)
    # A round of a request by key that a release before 2026-12-04 requested (named by the key) and that is still
    # requested is resumed as it was named, so it never stays requested; otherwise rounds are named by the hash.
    older = (0, None) if request.column else open_round(metastore, request, request.legacy_id_at)
    legacy = older[1] is not None
    name = request.legacy_id_at if legacy else request.id_at
    round_, row = older if legacy else open_round(metastore, request)
    erasure = name(round_)
    scanned = "partition" if request.column else "backup"
    if row is not None:
        marks = Watermarks(row["watermarks"])
    elif kafka is not None and topics:
        marks = request_watermarks(blocks, topics, high_watermarks(kafka, topics))
    else:
        marks = request_watermarks([b for b in blocks if b.group == scanned], topics, None)
    report = ErasureReport(id=erasure, dry_run=dry_run, state="dry-run" if dry_run else "requested",
                           previous=name(round_ - 1) if round_ else "",
                           watermarks=[m.model_dump() for m in marks.marks], unnamed=marks.unnamed,
                           delete_delay=row["delete_delay_ms"] / 1000 if row else request.delete_delay)
    reader = open_bucket(bucket)
    if dry_run:
        report.unindexed = unindexed(metastore, scanned, marks, topics, DeadLetterQueue(reader).queued(DLQ_PREFIX))
    else:
        await_indexed(metastore, reader, scanned, marks, topics, wait, sleep=sleep)
        blocks = metastore.tenant_blocks(request.tenant)  # those the wait saw committed
        answer = metastore_writer(metastore).submit(RequestErasure(
            id=erasure, round=round_, by=by, tenant=request.tenant, topics=sorted(set(request.topics)),
            # Only the key's hash reaches the metastore's log (a round an earlier release requested is resumed
            # with the key it was named by).
            key=base64.b64encode(request.key).decode() if legacy else "",
            key_sha256="" if legacy else request.key_sha256, column=request.column, value_sha256=request.value_sha256,
            watermarks=marks.marks, unnamed=marks.unnamed,
            delete_delay_ms=int(request.delete_delay * 1000))).raise_for_rejection()
        report.by, report.requested_at = answer.data["by"], answer.data["requested_at"]
        if answer.data["replay"]:  # another run requested this round meanwhile: its watermarks stand
            row = metastore.erasures(erasure)[0]
            if row["state"] != "requested":
                return _report(row, replay=True)
            marks = Watermarks(row["watermarks"])
            report.watermarks, report.unnamed = [m.model_dump() for m in marks.marks], marks.unnamed
    if request.column:
        scan = find_column_matches(reader, blocks, request.column, request.value_sha256, request.topics, marks)
    else:
        scan = find_matches(reader, blocks, request.key, request.topics, marks)
    report.records, report.blocks = _records(scan), _blocks(reader, scan)
    report.rows_to_remove = by_group(report.blocks, "rows_to_remove")
    report.undecided = [{"topic": m.topic, "partition": m.partition, "offset": m.offset, "block": m.block}
                        for m in scan.undecided]
    report.matches = len(report.records)
    report.blocks_total, report.blocks_opened = scan.blocks_total, len(scan.opened)
    if dry_run:
        return report
    result = metastore_writer(metastore).submit(PlanErasure(id=erasure, positions=[
        ErasedPosition(topic=t, partition=p, offset=o, incarnation=i) for t, p, o, i in scan.positions]))
    result.raise_for_rejection()
    report.jobs = list(result.data.get("jobs", []))
    report.state = erasure_status(metastore, erasure).state
    return report


def metastore_writer(metastore: ErasureMetastore) -> ErasureWriter:
    if not hasattr(metastore, "submit"):
        raise TypeError("an erasure that is not a dry run needs a writable metastore (open_metastore)")
    return metastore  # type: ignore[return-value]


def _report(row: dict[str, Any], *, replay: bool = False) -> ErasureReport:
    blocks = [{"id": b["old"], "new": b["new"], "group": b["group"], "generation": b["generation"],
               "rows_removed": b["rows_removed"]} for b in row["blocks"]]
    return ErasureReport(
        id=row["id"], dry_run=False, state=row["state"], replay=replay, by=row["by"], requested_at=row["requested_at"],
        watermarks=[m.model_dump() for m in Watermarks(row["watermarks"]).marks],
        unnamed=Watermarks(row["watermarks"]).unnamed, matches=row["matches"],
        blocks=blocks, rows_removed=by_group(blocks, "rows_removed"), jobs=list(row["pending_jobs"]),
        delete_delay=row["delete_delay_ms"] / 1000)


def erasure_status(metastore: ErasureMetastore, erasure: str) -> ErasureReport:
    """What the metastore holds of an erasure: its request, state, the blocks rewritten and the jobs left."""
    from shale.errors import NotFoundError

    rows = metastore.erasures(erasure)
    if not rows:
        raise NotFoundError(f"no erasure {erasure}")
    return _report(rows[0])
