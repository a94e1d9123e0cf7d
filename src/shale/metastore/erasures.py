"""Erasures (``shale erase``, DESIGN 19): a request to remove every record of one key, kept in the replicated state
with the Kafka positions of its records and each block rewritten without them.

An erasure goes ``requested`` (``RequestErasure``: who, when, what, the high watermarks) -> ``rewriting``
(``PlanErasure``: the positions found in the backup group; every indexed block holding one gets an erase job, a
compaction job kind run by the compaction workers under the service's leases and fencing tokens) -> ``rewritten``
(its last erase job completed). While an erasure has positions, every block that enters the index holding one of
them and not written without it (``BlockMeta.erased``) gets an erase job too: a merge of blocks not rewritten yet,
a new generation read from Kafka, a repair's rebuild. So no path brings an erased record back into the index.

An erasure by a typed column's value (``matched_by`` ``column:<path>``; ``key`` otherwise) keeps the SHA-256 of
the value's canonical form in ``key_sha256`` (``shale.erase.column``); its positions were found in the partition
group, and everything after the plan is the same. The state keeps the key's SHA-256, never the key: whoever knows
the key can check a receipt against it, and the metastore does not keep the personal data it was asked to erase.
The rows live in the index's ``erasures``, ``erasure_positions`` and ``erasure_blocks`` tables, written only here,
inside the apply transaction.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable
from typing import Any

from shale.block import BlockMeta
from shale.block.layout import block_prefix
from shale.compaction.messages import ErasePlan, JobUpdate
from shale.compaction.model import Job, QueueKey
from shale.errors import CommandRejectedError
from shale.index import IndexWriter
from shale.metastore.commands import PlanErasure, RecordErasureReceipt, RequestErasure, Result

JOB_PREFIX = "erasure:"
"""Erase jobs are named ``erasure:<id>/<block>``; no tenant name holds a colon, so no merge job is named so."""
_COLUMNS = ("id", "seq", "by", "tenant", "topics", "key_sha256", "watermarks", "state", "requested_at", "planned_at",
            "ended_at", "matches", "receipt", "matched_by", "delete_delay_ms")
_SELECT = ", ".join(f'"{c}"' for c in _COLUMNS)


def erasure_id(tenant: str, topics: Iterable[str], key: bytes, column: str = "", value_sha256: str = "") -> str:
    """What names a request: the same tenant, topics and key (or column and value hash) are the same erasure."""
    what: list[str] = [base64.b64encode(key).decode()] if not column else ["column", column, value_sha256]
    text = json.dumps([tenant, sorted(set(topics)), *what])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def job_name(erasure: str, block_id: str) -> str:
    return f"{JOB_PREFIX}{erasure}/{block_id}"


def erasure_of(job: str) -> str | None:
    """The erasure an erase job works for; None for a merge job."""
    return job[len(JOB_PREFIX):].split("/", 1)[0] if job.startswith(JOB_PREFIX) else None


def apply_request(w: IndexWriter, cmd: RequestErasure, index: int, time_ms: int) -> Result:
    key = _key_bytes(cmd.key)
    if cmd.column and (key or not cmd.value_sha256):
        raise CommandRejectedError("an erasure by column names the value's SHA-256 and no key", reason="malformed")
    if erasure_id(cmd.tenant, cmd.topics, key, cmd.column, cmd.value_sha256) != cmd.id:
        raise CommandRejectedError(f"erasure id {cmd.id} does not name tenant {cmd.tenant}, these topics and key",
                                   reason="malformed")
    row = w.conn.execute("SELECT state, requested_at, by FROM erasures WHERE id = ?", (cmd.id,)).fetchone()
    if row is not None:
        return Result(ok=True, data={"id": cmd.id, "replay": True, "state": row[0], "requested_at": row[1],
                                     "by": row[2]})
    w.conn.execute(f"INSERT INTO erasures ({_SELECT}) VALUES ({', '.join('?' * len(_COLUMNS))})",
                   (cmd.id, index, cmd.by, cmd.tenant, json.dumps(sorted(set(cmd.topics))),
                    cmd.value_sha256 if cmd.column else hashlib.sha256(key).hexdigest(),
                    json.dumps([m.model_dump() for m in cmd.watermarks]), "requested", time_ms, 0, 0, 0, "",
                    f"column:{cmd.column}" if cmd.column else "key", cmd.delete_delay_ms))
    return Result(ok=True, data={"id": cmd.id, "replay": False, "state": "requested", "requested_at": time_ms,
                                 "by": cmd.by})


def _key_bytes(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        raise CommandRejectedError("an erasure's key must be base64", reason="malformed") from None


def apply_plan(w: IndexWriter, cmd: PlanErasure, index: int, time_ms: int) -> Result:
    row = w.conn.execute("SELECT state, tenant, topics, watermarks FROM erasures WHERE id = ?", (cmd.id,)).fetchone()
    if row is None:
        raise CommandRejectedError(f"no erasure {cmd.id} was requested", reason="unknown-erasure")
    state, tenant, topics_json, marks_json = row
    if state != "requested":
        return Result(ok=True, data={"id": cmd.id, "replay": True, "state": state})
    topics = set(json.loads(topics_json))
    ends = {(m["topic"], m["partition"]): m["end"] for m in json.loads(marks_json)}
    for p in cmd.positions:
        if topics and p.topic not in topics:
            raise CommandRejectedError(f"position {p.topic}[{p.partition}]@{p.offset} is of a topic the erasure "
                                       "does not name", reason="malformed")
        if (p.topic, p.partition) in ends and p.offset >= ends[(p.topic, p.partition)]:
            raise CommandRejectedError(f"position {p.topic}[{p.partition}]@{p.offset} is at or past the high "
                                       "watermark the erasure was requested at", reason="malformed")
    w.conn.executemany("INSERT OR IGNORE INTO erasure_positions (tenant, topic, partition, offset, incarnation, "
                       "erasure) VALUES (?, ?, ?, ?, ?, ?)",
                       [(tenant, p.topic, p.partition, p.offset, p.incarnation, cmd.id) for p in cmd.positions])
    w.conn.execute("UPDATE erasures SET state = 'rewriting', planned_at = ?, matches = ? WHERE id = ?",
                   (time_ms, len(set(cmd.positions)), cmd.id))
    jobs = cover(w, w.tenant_block_metas(tenant), time_ms, only=cmd.id)
    _finish_if_done(w, cmd.id, time_ms)
    return Result(ok=True, data={"id": cmd.id, "replay": False, "jobs": jobs, "matches": len(set(cmd.positions))})


def apply_receipt(w: IndexWriter, cmd: RecordErasureReceipt, time_ms: int) -> Result:
    row = w.conn.execute("SELECT state, receipt FROM erasures WHERE id = ?", (cmd.id,)).fetchone()
    if row is None:
        raise CommandRejectedError(f"no erasure {cmd.id} was requested", reason="unknown-erasure")
    if row[0] == "done":
        return Result(ok=True, data={"id": cmd.id, "replay": True, "receipt": row[1]})
    if row[0] != "rewritten":
        raise CommandRejectedError(f"erasure {cmd.id} is {row[0]}: a receipt comes after its last rewrite",
                                   reason="not-rewritten")
    w.conn.execute("UPDATE erasures SET state = 'done', receipt = ?, ended_at = ? WHERE id = ?",
                   (cmd.key, time_ms, cmd.id))
    return Result(ok=True, data={"id": cmd.id, "replay": False, "receipt": cmd.key})


def positions_in(w: Any, erasure: str | None, block: BlockMeta) -> list[tuple[str, str, int, int, str]]:
    """(erasure, topic, partition, offset, incarnation) of the erased records inside ``block``'s Kafka ranges (of
    one erasure, or of all); ``w`` is an index writer or reader (anything with ``conn``)."""
    out: list[tuple[str, str, int, int, str]] = []
    for r in block.kafka:
        if r.end <= r.start:
            continue
        sql = ("SELECT erasure, topic, partition, offset, incarnation FROM erasure_positions WHERE tenant = ? AND "
               "topic = ? AND partition = ? AND offset >= ? AND offset < ? AND (incarnation = ? OR incarnation = '' "
               "OR ? = '')")
        args: list[object] = [block.tenant, r.topic, r.partition, r.start, r.end, r.incarnation, r.incarnation]
        if erasure is not None:
            sql += " AND erasure = ?"
            args.append(erasure)
        out.extend(w.conn.execute(sql, args))
    return sorted(set(out))


def cover(w: IndexWriter, blocks: Iterable[BlockMeta], time_ms: int, only: str | None = None,
          parents: list[BlockMeta] | None = None) -> list[str]:
    """Give every one of ``blocks`` (just added to the index) that holds a record of an erasure (``only``: of that
    one) and was not written without it an erase job; the names of the jobs made. Cheap when no erasure exists.
    ``parents`` are the blocks a merge output was made of: it lacks an erasure's records when every parent whose
    ranges hold one was written without them (the merge records only the erasures all its sources name)."""
    if only is None and w.conn.execute("SELECT 1 FROM erasure_positions LIMIT 1").fetchone() is None:
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
    its parent, with its lineage and Kafka ranges (the erased offsets stay accounted for), no more rows, and the
    erasure in ``erased``."""
    erasure = erasure_of(job.name)
    if len(outputs) != 1:
        return f"an erase job writes one block, not {len(outputs)}"
    out = outputs[0]
    if out.id == source.id:
        return "the output reuses the source's id"
    if (out.tenant, out.shard, out.group, out.generation, out.level) != (source.tenant, source.shard, source.group,
                                                                         source.generation, source.level):
        return f"output {out.id} is not of its source's tenant, shard, group, generation and level"
    if out.compaction.parents != [source.id] or sorted(out.compaction.sources) != sorted(source.compaction.sources):
        return f"output {out.id} does not name its source as parent with the source's lineage"
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
    delay = w.conn.execute("SELECT delete_delay_ms FROM erasures WHERE id = ?", (erasure,)).fetchone()
    w.add_tombstone(source, at, f"erased by {erasure} into {out.id}", delay[0] if delay else 0)
    w.add_blocks([out], at)
    w.conn.execute(
        "INSERT OR REPLACE INTO erasure_blocks (erasure, old_block, new_block, grp, generation, rows_removed, "
        "old_files, new_files, rewritten_at, old_prefix, new_prefix) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (erasure, source.id, out.id, source.group, source.generation, source.rows - out.rows,
         json.dumps([f.model_dump() for f in source.files]), json.dumps([f.model_dump() for f in out.files]), at,
         block_prefix(source), block_prefix(out)))
    w.compaction.delete_job(job.name)
    cover(w, [out], at)
    _finish_if_done(w, erasure, at)
    return "completed"


def _finish_if_done(w: IndexWriter, erasure: str, at: int) -> None:
    left = w.conn.execute("SELECT 1 FROM compaction_jobs WHERE name >= ? AND name < ? LIMIT 1",
                          (job_name(erasure, ""), job_name(erasure, "\x7f"))).fetchone()
    if left is None:
        w.conn.execute("UPDATE erasures SET state = 'rewritten', ended_at = ? WHERE id = ? AND state = 'rewriting'",
                       (at, erasure))
    else:
        w.conn.execute("UPDATE erasures SET state = 'rewriting', ended_at = 0 WHERE id = ? AND state = 'rewritten'",
                       (erasure,))


def already_completed(w: IndexWriter, update: JobUpdate) -> bool:
    """Whether an erase job's success report describes a rewrite the index holds (a retried report)."""
    erasure = erasure_of(update.job)
    if erasure is None or update.status != "success" or len(update.outputs) != 1:
        return False
    out = update.outputs[0]
    return all(w.tombstone_reason(p) == f"erased by {erasure} into {out.id}" for p in out.compaction.parents)


def erasure_rows(conn: Any, erasure: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
    """Erasures, newest first (or the one named), with the blocks rewritten for each, as the API shows them."""
    sql = f"SELECT {_SELECT} FROM erasures"
    args: list[object] = []
    if erasure is not None:
        sql += " WHERE id = ?"
        args.append(erasure)
    rows = []
    for r in conn.execute(sql + " ORDER BY seq DESC LIMIT ?", [*args, limit]).fetchall():
        row = dict(zip(_COLUMNS, r, strict=True))
        row["topics"] = json.loads(row["topics"])
        row["watermarks"] = json.loads(row["watermarks"])
        row["blocks"] = [
            {"old": b[0], "new": b[1], "group": b[2], "generation": b[3], "rows_removed": b[4],
             "old_files": json.loads(b[5]), "new_files": json.loads(b[6]), "rewritten_at": b[7],
             "old_prefix": b[8], "new_prefix": b[9]}
            for b in conn.execute("SELECT old_block, new_block, grp, generation, rows_removed, old_files, new_files, "
                                  "rewritten_at, old_prefix, new_prefix FROM erasure_blocks WHERE erasure = ? "
                                  "ORDER BY rewritten_at, old_block", (row["id"],))]
        row["positions"] = [list(p) for p in conn.execute(
            "SELECT topic, partition, offset, incarnation FROM erasure_positions WHERE erasure = ? "
            "ORDER BY topic, partition, offset, incarnation", (row["id"],))]
        row["pending_jobs"] = [j[0] for j in conn.execute(
            "SELECT name FROM compaction_jobs WHERE name >= ? AND name < ? ORDER BY name",
            (job_name(row["id"], ""), job_name(row["id"], "\x7f")))]
        rows.append(row)
    return rows


def erased_offsets(rows: list[dict[str, Any]], topic: str, incarnation: str = "",
                   tenant: str | None = None) -> dict[int, dict[int, str]]:
    """Per partition of ``topic`` (of ``incarnation``; '' any), each erased offset and the erasure that erased it,
    from ``erasure_rows``' rows (of ``tenant``, or any): verify, the ledger and restore report these as erased,
    never as missing."""
    out: dict[int, dict[int, str]] = {}
    for row in rows:
        if tenant is not None and row["tenant"] != tenant:
            continue
        for t, partition, offset, inc in row.get("positions", []):
            if t == topic and (not incarnation or not inc or inc == incarnation):
                out.setdefault(int(partition), {})[int(offset)] = row["id"]
    return out
