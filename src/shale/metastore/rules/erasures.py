"""Erasures (``shale erase``, DESIGN 19): a request to remove every record of one key, kept in the replicated state
with the Kafka positions of its records and each block rewritten without them.

An erasure goes ``requested`` (``RequestErasure``: who, when, what, the high watermarks per topic incarnation,
``Watermarks``; a request made again once the one before is past ``requested`` is its next round) -> ``rewriting``
(``PlanErasure``: the positions found in the backup group; every indexed block holding one gets an erase job, a
compaction job kind run by the compaction workers under the service's leases and fencing tokens) -> ``rewritten``
(its last erase job completed). While an erasure has positions, every block that enters the index holding one of
them and not written without it (``BlockMeta.erased``) gets an erase job too: a merge of blocks not rewritten yet,
a new generation read from Kafka, a repair's rebuild. So no path brings an erased record back into the index.

An erasure by a typed column's value (``matched_by`` ``column:<path>``; ``key`` otherwise) keeps the SHA-256 of
the value's canonical form in ``key_sha256`` (``shale.erase.column``; one per kind, sorted and comma-separated,
when the column's types in scope differ in kind); its positions were found in the partition group, and everything
after the plan is the same. The state keeps the key's SHA-256, never the key: whoever knows
the key can check a receipt against it, and the metastore does not keep the personal data it was asked to erase.
The rows live in the index's erasure store (``shale.index.erasures``: the ``erasures``, ``erasure_positions`` and
``erasure_blocks`` tables), written only from here, inside the apply transaction.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal

from shale.block import BlockMeta, block_prefix
from shale.compaction import ErasePlan, Job, JobUpdate, QueueKey
from shale.errors import CommandRejectedError
from shale.index import CompactionState, IndexWriter
from shale.index import erasures as store
from shale.metastore.rules.commands import ErasureWatermark, PlanErasure, RecordErasureReceipt, RequestErasure, Result

JOB_PREFIX = "erasure:"
"""Erase jobs are named ``erasure:<id>/<block>``; no tenant name holds a colon, so no merge job is named so."""


def erasure_id(tenant: str, topics: Iterable[str], key: bytes, column: str = "", value_sha256: str = "",
               round_: int = 0, key_sha256: str = "") -> str:
    """What names an erasure: the same tenant, topics and key (or column and value hash) are one request, and
    ``round_`` counts the times it was made again after the one before got past ``requested`` (round 0 is named
    as before rounds existed). A request by ``key_sha256`` (the key's SHA-256, in place of the key: since
    2026-12-04) is named by that hash, so the metastore checks its id without ever holding the key."""
    if key_sha256 and not column:
        what: list[object] = ["key-sha256", key_sha256]
    else:
        what = [base64.b64encode(key).decode()] if not column else ["column", column, value_sha256]
    text = json.dumps([tenant, sorted(set(topics)), *what, *([round_] if round_ else [])])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class Watermarks:
    """An erasure request's high watermarks (``RequestErasure.watermarks``), and which of the key's records they
    leave out as produced after the request: one rule for the scan, the plan's check and the receipt's final scan.

    A request names every partition and topic incarnation it knew (``unnamed`` ``later``, stored as
    ``{"marks": [...], "unnamed": "later"}``): Kafka's current incarnation bounded by its high watermark, each
    older incarnation the index held whole (``older``: all of it was produced before), or, without Kafka, each
    incarnation the index held bounded by its highest indexed end. A record of a partition or an incarnation it
    does not name is new data: a topic recreated (or first created) after the request. A request of an earlier
    release (stored as a bare list: ``unnamed`` ``older``) named Kafka's incarnation only and is read as it was
    then: a record of another incarnation, or of a partition no watermark names, is the request's whatever its
    offset, and a watermark without an incarnation bounds every incarnation.

    A record whose incarnation its block cannot tell ('': written before Shale recorded incarnations, or merged
    from two without naming its rows) is bounded by the highest bounded end of its partition: its position would
    match every incarnation's record at that offset, so erasing it at or past that end could remove another key's
    record produced later. Such records of the key are reported (``ScanResult.undecided``), not erased."""

    def __init__(self, marks: Iterable[ErasureWatermark | dict[str, Any]] | dict[str, Any],
                 unnamed: str = "older") -> None:
        if isinstance(marks, dict):  # the stored form of a request naming every incarnation it knew
            stored: dict[str, Any] = marks
            marks, unnamed = list(stored["marks"]), str(stored["unnamed"])
        if unnamed not in ("older", "later"):
            raise ValueError(f"a request's unnamed incarnations are older or later, not {unnamed!r}")
        self.unnamed: Literal["older", "later"] = "later" if unnamed == "later" else "older"
        self.marks = [m if isinstance(m, ErasureWatermark) else ErasureWatermark.model_validate(m) for m in marks]
        self.ends: dict[tuple[str, int], dict[str, ErasureWatermark]] = {}
        for m in self.marks:
            self.ends.setdefault((m.topic, m.partition), {})[m.incarnation] = m

    def stored(self) -> list[dict[str, Any]] | dict[str, Any]:
        """The JSON form kept in the request's row (and its receipt); ``Watermarks`` reads it back."""
        marks = [m.model_dump() for m in self.marks]
        return marks if self.unnamed == "older" else {"marks": marks, "unnamed": self.unnamed}

    def produced_later(self, topic: str, partition: int, offset: int, incarnation: str) -> bool:
        """Whether the record at ``topic[partition]@offset`` of ``incarnation`` ('' unknown) is new data."""
        ends = self.ends.get((topic, partition))
        if not ends:  # a partition the request did not know: created after it (or, earlier, Kafka was not asked)
            return self.unnamed == "later"
        if self.unnamed == "older":
            if "" in ends:
                return offset >= ends[""].end
            if incarnation:
                return incarnation in ends and offset >= ends[incarnation].end
            return offset >= max(m.end for m in ends.values())
        if incarnation and incarnation in ends:
            mark = ends[incarnation]
            return not mark.older and offset >= mark.end
        if incarnation:
            return True  # an incarnation the request did not know: the topic recreated after it
        bounded = [m.end for m in ends.values() if not m.older]
        return bool(bounded) and offset >= max(bounded)

    def undecided(self, topic: str, partition: int, offset: int, incarnation: str) -> bool:
        """Whether the record is left out only because its incarnation is unknown (see the class)."""
        ends = self.ends.get((topic, partition), {})
        legacy = self.unnamed == "older" and "" in ends
        return bool(ends) and not incarnation and not legacy and self.produced_later(topic, partition, offset, "")


def job_name(erasure: str, block_id: str) -> str:
    return f"{JOB_PREFIX}{erasure}/{block_id}"


def erasure_of(job: str) -> str | None:
    """The erasure an erase job works for; None for a merge job."""
    return job[len(JOB_PREFIX):].split("/", 1)[0] if job.startswith(JOB_PREFIX) else None


def apply_request(w: IndexWriter, cmd: RequestErasure, index: int, time_ms: int) -> Result:
    key = _key_bytes(cmd.key)
    if cmd.column and (key or not cmd.value_sha256 or cmd.key_sha256):
        raise CommandRejectedError("an erasure by column names the value's SHA-256 and no key", reason="malformed")
    if cmd.key_sha256 and key:
        raise CommandRejectedError("an erasure names its key or the key's SHA-256, not both", reason="malformed")
    if erasure_id(cmd.tenant, cmd.topics, key, cmd.column, cmd.value_sha256, cmd.round, cmd.key_sha256) != cmd.id:
        raise CommandRejectedError(f"erasure id {cmd.id} does not name tenant {cmd.tenant}, these topics, key and "
                                   f"round {cmd.round}", reason="malformed")
    row = store.request(w.conn, cmd.id)
    if row is not None:
        return Result(ok=True, data={"id": cmd.id, "replay": True, "state": row[0], "requested_at": row[1],
                                     "by": row[2]})
    if cmd.round:  # one round at a time: the one before must exist and be past ``requested``
        before = store.request(w.conn, erasure_id(cmd.tenant, cmd.topics, key, cmd.column, cmd.value_sha256,
                                                  cmd.round - 1, cmd.key_sha256))
        if before is None or before[0] == "requested":
            raise CommandRejectedError(
                f"erasure round {cmd.round} of this request comes after round {cmd.round - 1}, which is "
                + ("not requested" if before is None else "still requested: run the request again to resume it"),
                reason="not-next")
    store.add_request(w.conn, {
        "id": cmd.id, "seq": index, "by": cmd.by, "tenant": cmd.tenant, "topics": json.dumps(sorted(set(cmd.topics))),
        "key_sha256": cmd.value_sha256 if cmd.column else cmd.key_sha256 or hashlib.sha256(key).hexdigest(),
        "watermarks": json.dumps(Watermarks(cmd.watermarks, cmd.unnamed).stored()), "state": "requested",
        "requested_at": time_ms, "planned_at": 0, "ended_at": 0, "matches": 0, "receipt": "",
        "matched_by": f"column:{cmd.column}" if cmd.column else "key", "delete_delay_ms": cmd.delete_delay_ms})
    return Result(ok=True, data={"id": cmd.id, "replay": False, "state": "requested", "requested_at": time_ms,
                                 "by": cmd.by})


def _key_bytes(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        raise CommandRejectedError("an erasure's key must be base64", reason="malformed") from None


def apply_plan(w: IndexWriter, cmd: PlanErasure, index: int, time_ms: int) -> Result:
    row = store.scope(w.conn, cmd.id)
    if row is None:
        raise CommandRejectedError(f"no erasure {cmd.id} was requested", reason="unknown-erasure")
    state, tenant, topics_json, marks_json = row
    if state != "requested":
        return Result(ok=True, data={"id": cmd.id, "replay": True, "state": state})
    topics = set(json.loads(topics_json))
    marks = Watermarks(json.loads(marks_json))
    for p in cmd.positions:
        if topics and p.topic not in topics:
            raise CommandRejectedError(f"position {p.topic}[{p.partition}]@{p.offset} is of a topic the erasure "
                                       "does not name", reason="malformed")
        if marks.produced_later(p.topic, p.partition, p.offset, p.incarnation):
            raise CommandRejectedError(f"position {p.topic}[{p.partition}]@{p.offset} is at or past the high "
                                       "watermark the erasure was requested at", reason="malformed")
    store.add_positions(w.conn, cmd.id, tenant,
                        [(p.topic, p.partition, p.offset, p.incarnation) for p in cmd.positions])
    store.set_planned(w.conn, cmd.id, time_ms, len(set(cmd.positions)))
    store.shorten_tombstones(w.conn, tenant)  # a merge's sources tombstoned before: they go with this delay
    jobs = cover(w, w.tenant_block_metas(tenant), time_ms, only=cmd.id)
    _finish_if_done(w, cmd.id, time_ms)
    return Result(ok=True, data={"id": cmd.id, "replay": False, "jobs": jobs, "matches": len(set(cmd.positions))})


def apply_receipt(w: IndexWriter, cmd: RecordErasureReceipt, time_ms: int) -> Result:
    row = store.receipt(w.conn, cmd.id)
    if row is None:
        raise CommandRejectedError(f"no erasure {cmd.id} was requested", reason="unknown-erasure")
    if row[0] == "done":
        return Result(ok=True, data={"id": cmd.id, "replay": True, "receipt": row[1]})
    if row[0] != "rewritten":
        raise CommandRejectedError(f"erasure {cmd.id} is {row[0]}: a receipt comes after its last rewrite",
                                   reason="not-rewritten")
    store.set_done(w.conn, cmd.id, cmd.key, time_ms)
    return Result(ok=True, data={"id": cmd.id, "replay": False, "receipt": cmd.key})


def positions_in(w: Any, erasure: str | None, block: BlockMeta) -> list[tuple[str, str, int, int, str]]:
    """(erasure, topic, partition, offset, incarnation) of the erased records inside ``block``'s Kafka ranges (of
    one erasure, or of all); ``w`` is an index writer or reader (anything with ``conn``)."""
    out: list[tuple[str, str, int, int, str]] = []
    for r in block.kafka:
        if r.end > r.start:
            out.extend(store.positions_between(w.conn, erasure, block.tenant, r.topic, r.partition, r.start, r.end,
                                               r.incarnation))
    return sorted(set(out))


def cover(w: IndexWriter, blocks: Iterable[BlockMeta], time_ms: int, only: str | None = None,
          parents: list[BlockMeta] | None = None) -> list[str]:
    """Give every one of ``blocks`` (just added to the index) that holds a record of an erasure (``only``: of that
    one) and was not written without it an erase job; the names of the jobs made. Cheap when no erasure exists.
    ``parents`` are the blocks a merge output was made of: it lacks an erasure's records when every parent whose
    ranges hold one was written without them (the merge records only the erasures all its sources name)."""
    if only is None and not store.any_positions(w.conn):
        return []
    made = []
    for block in blocks:
        done = set(block.erased or ())
        wanted = {p[0] for p in positions_in(w, only, block)} - done
        if parents:
            wanted = {e for e in wanted if any(positions_in(w, e, p) and e not in (p.erased or ()) for p in parents)}
        for erasure in sorted(wanted):
            name = job_name(erasure, block.id)
            if w.compaction.job(name) is not None or not w.has_block(block.id):
                continue
            w.compaction.dequeue([block.id])
            w.compaction.save_job(Job(name, QueueKey(block.tenant, block.shard, block.level, block.group,
                                                     block.generation),
                                      [block.id], sum(d.bytes for d in block.datasets), time_ms))
            made.append(name)
    return made


def erase_plan(w: Any, job: str, source: BlockMeta) -> ErasePlan | None:
    """What an erase job's worker needs beyond its source: the erasure and the positions inside the source."""
    erasure = erasure_of(job)
    if erasure is None:
        return None
    return ErasePlan(erasure=erasure, positions=[(t, p, o, i) for _, t, p, o, i in positions_in(w, erasure, source)])


def merge_erased(w: Any, sources: list[BlockMeta]) -> list[str] | None:
    """The erasures a merge of ``sources`` is written without: those some source names, where every source whose
    ranges hold one of its records names it too (a source not rewritten yet still holds them)."""
    named = {e for s in sources for e in s.erased or ()}
    kept = {e for e in named if all(e in (s.erased or ()) or not positions_in(w, e, s) for s in sources)}
    return sorted(kept) or None


def output_problem(job: Job, source: BlockMeta, outputs: list[BlockMeta]) -> str | None:
    """Why ``outputs`` cannot replace an erase job's source, or None: one block of the source's kind, naming it as
    its parent, with its lineage (and its own id) and Kafka ranges (the erased offsets stay accounted for), no more
    rows, and the erasure in ``erased``."""
    erasure = erasure_of(job.name)
    if len(outputs) != 1:
        return f"an erase job writes one block, not {len(outputs)}"
    out = outputs[0]
    if out.id == source.id:
        return "the output reuses the source's id"
    if (out.tenant, out.shard, out.group, out.generation, out.level) != (source.tenant, source.shard, source.group,
                                                                         source.generation, source.level):
        return f"output {out.id} is not of its source's tenant, shard, group, generation and level"
    # Its lineage is the source's and its own id (``shale.compactor.erase.erased_lineage``); the source's alone
    # from a worker of an earlier release (a rolling upgrade), whose rewrite a bucket scanner may rank below it.
    lineage = set(source.compaction.sources)
    if out.compaction.parents != [source.id] or set(out.compaction.sources) not in (lineage | {out.id}, lineage):
        return f"output {out.id} does not name its source as parent with the source's lineage and its own id"
    if sorted(out.kafka, key=str) != sorted(source.kafka, key=str):
        return f"output {out.id}'s Kafka ranges differ from its source's"
    if out.rows > source.rows:
        return f"output {out.id} holds {out.rows} rows, more than its source's {source.rows}"
    if erasure not in (out.erased or ()):
        return f"output {out.id} does not say it was written without erasure {erasure}"
    return None


def complete(w: IndexWriter, job: Job, update: JobUpdate, at: int) -> str:
    """An erase job's success: the rewritten block replaces its source (tombstoned "erased by <id> into <new>"),
    the rewrite is recorded for the receipt, and the erasure is rewritten once its last job is done."""
    erasure = erasure_of(job.name)
    assert erasure is not None
    source = w.get_block(job.sources[0])
    if source is None:  # a merge took it first: its output has an erase job of its own (``cover``)
        return "sources-missing"
    problem = output_problem(job, source, update.outputs)
    out = update.outputs[0] if update.outputs else None
    if problem is None and out is not None and (w.tombstoned(out.id) or w.has_block(out.id)):
        problem = "the output was already indexed or deleted"
    if problem is not None or out is None:
        return f"invalid-outputs: {problem}"
    w.remove_block(source.id)
    w.add_tombstone(source, at, f"erased by {erasure} into {out.id}", store.delete_delay(w.conn, erasure))
    w.add_blocks([out], at)
    store.add_rewrite(w.conn, erasure, source.id, out.id, source.group, source.generation, source.rows - out.rows,
                      [f.model_dump() for f in source.files], [f.model_dump() for f in out.files], at,
                      block_prefix(source), block_prefix(out))
    w.compaction.delete_job(job.name)
    cover(w, [out], at)
    _finish_if_done(w, erasure, at)
    return "completed"


def _finish_if_done(w: IndexWriter, erasure: str, at: int) -> None:
    if not _jobs_of(w.compaction, erasure, limit=1):
        store.set_rewritten(w.conn, erasure, at)
    else:
        store.set_rewriting(w.conn, erasure)


def _jobs_of(compaction: CompactionState, erasure: str, limit: int = -1) -> list[str]:
    """The names of the erasure's erase jobs still to run."""
    return compaction.job_names(job_name(erasure, ""), job_name(erasure, "\x7f"), limit)


def already_completed(w: IndexWriter, update: JobUpdate) -> bool:
    """Whether an erase job's success report describes a rewrite the index holds (a retried report)."""
    erasure = erasure_of(update.job)
    if erasure is None or update.status != "success" or len(update.outputs) != 1:
        return False
    out = update.outputs[0]
    return all(w.tombstone_reason(p) == f"erased by {erasure} into {out.id}" for p in out.compaction.parents)


def erasure_rows(conn: Any, erasure: str | None = None, limit: int = 100,
                 before: int | None = None) -> list[dict[str, Any]]:
    """Erasures, newest first (or the one named; ``before``: requested before that log index, the next page),
    with the blocks rewritten for each and the erase jobs still to run, as the API shows them."""
    rows = store.erasure_rows(conn, erasure, limit, before)
    for row in rows:
        row["pending_jobs"] = _jobs_of(CompactionState(conn), row["id"])
    return rows


PAGE = 1000
"""The most erasures one read answers (``GET /v1/erasures``'s ``limit``)."""


def every_erasure(erasures: Callable[..., list[dict[str, Any]]]) -> Iterator[dict[str, Any]]:
    """Every erasure, newest first, read a page at a time from ``erasures`` (an ``ErasureReads.erasures``)."""
    before: int | None = None
    while True:
        page = erasures(limit=PAGE, before=before)
        yield from page
        if len(page) < PAGE:
            return
        before = int(page[-1]["seq"])


def erased_offsets(rows: Iterable[dict[str, Any]], topic: str, incarnation: str = "",
                   tenant: str | None = None) -> dict[int, dict[int, str]]:
    """Per partition of ``topic`` (of ``incarnation``; '' any), each erased offset and the erasure that erased it,
    from ``erasure_rows``' rows (of ``tenant``, or any; every erasure's: ``every_erasure``): verify, the ledger
    and restore report these as erased, never as missing."""
    out: dict[int, dict[int, str]] = {}
    for row in rows:
        if tenant is not None and row["tenant"] != tenant:
            continue
        for t, partition, offset, inc in row.get("positions", []):
            if t == topic and (not incarnation or not inc or inc == incarnation):
                out.setdefault(int(partition), {})[int(offset)] = row["id"]
    return out
