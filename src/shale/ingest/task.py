"""The Spark task of an ingest batch (``mapInArrow``): the planned ranges of one or more Kafka partitions, read one
after another (the driver gives a batch no more tasks than Spark has cores: ``tasks``), written in chunks that
span the partitions the task reached (a chunk's blocks are cut by topic, tenant and hour, never by partition, so a
batch writes objects in proportion to its tasks, not its partitions).

Records arrive as Arrow batches of one partition each (``shale.ingest.source``). They are buffered
until the buffer reaches the chunk size, so a task holds at most about two chunks and one batch however large
its partitions' ranges or its records; the chunk size is what the task process's memory bound leaves once its
interpreter and libraries are loaded (``chunk_bytes``), measured again after every chunk (a reused Python worker
may keep memory from earlier tasks), never grown. The last full buffer is kept pending until the next one
fills or the input ends, because only then is it known whether its last partition goes on in the next chunk;
every other partition's range in a chunk ends at its planned end, covering trailing offsets without records such
as a transaction's commit marker. Each partition's chunks tile its planned range.

A chunk whose writer schemas are not cached in this process and that the Schema Registry does not give
(``RegistryUnavailableError``: refused, timed out, 5xx, 401/403) pauses the partitions of that topic there (a
topic's blocks hold all of its partitions in the chunk; the chunk's other topics are written as usual): nothing of
that topic is written, the task keeps reading its input to the end without writing those partitions (a Python worker
that leaves input unread is not reused, and its schema cache would go with it) and goes on with the others, and
returns a ``Paused`` per paused partition after the chunks written. The driver commits those chunks only
(``shale.ingest.pauses``), so a paused partition continues at its paused chunk's first offset in a later batch.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict

from shale.encoder import Chunk, GroupSpec, Written, encode_written, normalize, write_chunks
from shale.errors import ShaleError
from shale.failpoints import failpoint
from shale.ingest.plan import BatchPlan, PartitionRange, TopicPartition
from shale.objstore import Bucket, CallCounter, counting_requests, scratch_bucket, task_bucket
from shale.resources import PeakMemory, release_free_memory
from shale.schemas import RegistryUnavailableError

ERROR_CHARS = 1000
"""How much of the registry's error a ``Paused`` carries."""


class Paused(BaseModel):
    """What an ingest task returns, after its chunks, for a partition it paused: offsets ``[at, planned end)`` were
    not written because the Schema Registry did not give a writer schema this process had not cached."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    topic: str
    partition: int
    incarnation: str = ""
    at: int
    """The first offset not written (the paused chunk's start): the partition's commit ends here."""
    registry: str = ""
    """The registry's URL (never credentials: the configuration refuses a URL that holds them)."""
    error: str = ""


class CountedBucket(Bucket, Protocol):
    """A bucket that counts its requests and the time they took (what an upload costs a chunk)."""

    calls: CallCounter


def _partition_of(run: pa.Table) -> TopicPartition:
    return run.column("topic")[0].as_py(), int(run.column("partition")[0].as_py())


class ChunkWriter:
    """Not thread-safe; one per task. It takes the records of the task's partitions one after another (each
    partition's in one run, in offset order) and writes them in chunks of about ``chunk_bytes``, a chunk holding
    whatever partitions it reached (``write_chunks``: a block per topic, tenant and hour, not per partition). Every
    chunk's first ``Written`` carries the seconds spent on it by phase (``PHASES``), since the chunk before."""

    def __init__(self, spec: GroupSpec, bucket: CountedBucket, plan: BatchPlan, chunk_bytes: int,
                 derived_from: list[str] | None = None, resize: Callable[[int], int] | None = None,
                 pausable: bool = False, spent: defaultdict[str, float] | None = None) -> None:
        self.spec = spec
        self.pausable = pausable
        """Whether a registry that does not answer pauses the partitions (ingest) rather than raising (reprocess)."""
        self.pauses: list[Paused] = []
        self.derived_from = derived_from
        self.bucket = bucket
        self.plan = plan
        self.chunk_bytes = chunk_bytes
        self.resize = resize  # after each written chunk: a new size given the bytes still held (never larger)
        self.planned: dict[TopicPartition, PartitionRange] = {}  # each partition's range, once a record names it
        self.next_start: dict[TopicPartition, int] = {}
        self.current: TopicPartition | None = None
        self.buffer: list[pa.Table] = []  # runs of one partition each, in input order
        self.buffered = 0
        self.pending: list[pa.Table] = []
        self.spent = spent if spent is not None else defaultdict(float)
        """Seconds by phase since the last chunk written."""

    def paused(self, tp: TopicPartition) -> bool:
        return any((p.topic, p.partition) == tp for p in self.pauses)

    def _identify(self, table: pa.Table) -> TopicPartition:
        topics, partitions = pc.unique(table.column("topic")), pc.unique(table.column("partition"))
        if len(topics) != 1 or len(partitions) != 1:
            raise ShaleError("a chunk writer takes one Kafka partition's records at a time (partition_runs)")
        tp = (topics[0].as_py(), int(partitions[0].as_py()))
        if tp != self.current:
            if tp in self.planned:
                raise ShaleError(f"an ingest task received {tp[0]}[{tp[1]}] again after other partitions; Shale "
                                 "needs each partition's records in one run")
            planned = self.plan.range_of(*tp)
            if planned is None:
                raise ShaleError(f"an ingest task received {tp[0]}[{tp[1]}], which this batch did not plan")
            self.planned[tp], self.next_start[tp], self.current = planned, planned.start, tp
        planned = self.planned[tp]
        offsets = pc.min_max(table.column("offset"))
        if offsets["min"].as_py() < planned.start or offsets["max"].as_py() >= planned.end:
            raise ShaleError(f"{tp[0]}[{tp[1]}]: the task read offsets [{offsets['min']}, {offsets['max']}] outside "
                             f"the planned range [{planned.start},{planned.end})")
        return tp

    def _write(self, runs: list[pa.Table], continues: TopicPartition | None) -> list[Written]:
        """Write ``runs`` as one chunk. Each partition's range ends at its planned end, except ``continues``: the
        partition whose records go on in the next chunk ends after its last record here."""
        if not runs:
            return []
        ends: dict[TopicPartition, int] = {}
        for run in runs:
            tp = _partition_of(run)
            ends[tp] = int(run.column("offset")[-1].as_py()) + 1 if tp == continues else self.planned[tp].end
        chunks = [Chunk(tp[0], tp[1], self.planned[tp].incarnation, self.next_start[tp], end, self.plan.read_time_ms)
                  for tp, end in ends.items()]
        started, waited = time.perf_counter(), self.bucket.calls.seconds
        written: list[Written] = []
        for topic in dict.fromkeys(c.topic for c in chunks):  # a topic's blocks are its own: so are its pauses
            mine = [c for c in chunks if c.topic == topic]
            try:
                written += write_chunks(self.spec, self.bucket,
                                        pa.concat_tables([r for r in runs if _partition_of(r)[0] == topic]), mine,
                                        self.derived_from)
            except RegistryUnavailableError as exc:
                if not self.pausable:
                    raise
                # Nothing of this topic's chunk was written: the parser fetches schemas before any block is put.
                self.pauses += [Paused(topic=c.topic, partition=c.partition, incarnation=c.incarnation, at=c.start,
                                       registry=exc.registry, error=str(exc)[:ERROR_CHARS]) for c in mine]
                continue
            self.next_start.update({(c.topic, c.partition): c.end for c in mine})
        if not written:
            return []
        upload = self.bucket.calls.seconds - waited
        self.spent["upload"] += upload
        self.spent["encode"] += time.perf_counter() - started - upload
        seconds = {k: round(v, 6) for k, v in self.spent.items()}
        self.spent.clear()  # in place: the task's batch iterator adds its waits to this dict
        return [written[0].model_copy(update={"seconds": seconds}), *written[1:]]

    def _unpaused(self, runs: list[pa.Table]) -> list[pa.Table]:
        return [r for r in runs if not self.paused(_partition_of(r))]

    def _first(self) -> TopicPartition | None:
        return _partition_of(self.buffer[0]) if self.buffer else None

    def add(self, batch: pa.RecordBatch) -> list[Written]:
        """Records as a task's reader hands them over (a batch that ends one partition and starts the next is cut
        there)."""
        written = []
        for run in partition_runs(batch):
            started = time.perf_counter()
            table = normalize(pa.Table.from_batches([run]))
            self.spent["normalize"] += time.perf_counter() - started
            written += self.add_table(table)
        return written

    def add_table(self, table: pa.Table) -> list[Written]:
        """Records of one partition in the backup schema, in offset order after everything added of it before."""
        if table.num_rows == 0:
            return []
        if self.paused(self._identify(table)):
            return []  # read to the end, written no more
        self.buffer.append(table)
        self.buffered += table.nbytes
        if self.buffered < self.chunk_bytes:
            return []
        # The last full buffer waits until the next one fills (or the input ends): only then is it known whether
        # its last partition goes on after it.
        written = self._write(self._unpaused(self.pending), self._first())
        self.pending, self.buffer, self.buffered = self._unpaused(self.buffer), [], 0
        if written and self.resize is not None:
            self.chunk_bytes = min(self.chunk_bytes, self.resize(sum(t.nbytes for t in self.pending)))
        return written

    def finish(self) -> list[Written]:
        """Write what is left: every partition's last chunk ends at its planned end (covering trailing offsets
        without records, such as a transaction's commit marker). A partition no record named is not written here
        (the driver records its range with an empty block)."""
        written = self._write(self._unpaused(self.pending), self._first())
        written += self._write(self._unpaused(self.buffer), None)
        self.pending, self.buffer, self.buffered = [], [], 0
        return written


def chunk_bytes(bound: int, resident: int, group: str) -> int:
    """The chunk size that keeps a task process within ``bound`` bytes of resident memory, given what it holds
    already (its interpreter, libraries and caches): a task holds about two chunks and one incoming batch, and
    writing a chunk needs about three more copies of it in the backup group (encoding) and up to eleven in the
    partition group (parsing builds Python values and new columns), as measured with 5 MB records (the partition
    group peaked at 389 MiB of 384 with ten, in a Python worker reused after other ingests)."""
    copies = 6 if group == "backup" else 14
    return max(2**20, min(bound // 8, (bound - resident) // copies))


PHASES = {
    "wait": "waiting for the task's Kafka consumer's next records (shale.ingest.source)",
    "normalize": "Kafka's columns to the backup schema",
    "encode": "parsing, partitioning, Parquet encoding and checksums",
    "upload": "object-store requests (put-if-absent, the existence check, meta.json)",
}
"""The phases of a task's time (``Written.seconds``, ``shale_ingest_task_seconds_total``)."""


TASK_RESULT = pa.schema([("written", pa.string()), ("paused", pa.string()), ("requests", pa.string())])
"""An ingest task's rows: one of the three is set. ``requests`` is the ``RequestReport`` (JSON) of the bucket
requests the task made, in its own row after the others (the driver adds them to its metrics)."""
TASK_SCHEMA = "written string, paused string, requests string"
"""``TASK_RESULT`` in Spark's spelling."""


def _timed(batches: Iterable[pa.RecordBatch], spent: defaultdict[str, float]) -> Iterator[pa.RecordBatch]:
    """The batches, with the time spent waiting for each added to ``spent["wait"]``."""
    source = iter(batches)
    while True:
        started = time.perf_counter()
        batch = next(source, None)
        spent["wait"] += time.perf_counter() - started
        if batch is None:
            return
        yield batch


def partition_runs(batch: pa.RecordBatch) -> list[pa.RecordBatch]:
    """``batch`` cut where its Kafka partition changes: a task reads its partitions one after another, and one Arrow
    batch from Spark may hold the end of one and the start of the next."""
    topics, partitions = batch.column("topic"), batch.column("partition")
    if batch.num_rows == 0 or (len(pc.unique(partitions)) == 1 and len(pc.unique(topics)) == 1):
        return [batch] if batch.num_rows else []
    codes = pc.dictionary_encode(topics).indices.to_numpy(zero_copy_only=False).astype("int64")
    keys = (codes << 32) | partitions.to_numpy(zero_copy_only=False).astype("int64")
    cuts = [0, *(int(i) + 1 for i in (keys[1:] != keys[:-1]).nonzero()[0]), batch.num_rows]
    return [batch.slice(a, b - a) for a, b in itertools.pairwise(cuts)]


def tasks(ranges: int, cores: int) -> int:
    """How many Spark tasks read a batch of ``ranges`` partitions: one per partition up to Spark's cores, fewer
    than partitions beyond (``coalesce``: each task reads several in turn). A task's fixed cost (its launch, the
    Python hand-off, its first Arrow batch) is paid once per task instead of per partition; with 8 partitions of a
    low-latency batch on 2 cores, a Spark job took 1.93 s (median of 8; 1.27-2.34) as 8 tasks and 1.22 s
    (0.55-1.49) as 2, on the loaded machine (docs/DESIGN.md 10.7)."""
    return max(1, min(ranges, cores))


Records = Callable[[int], Iterable[pa.RecordBatch]]
"""A task's records by its index (``shale.ingest.source.read_ranges`` over the task's share of the plan)."""


def task_index(inputs: Iterable[pa.RecordBatch]) -> int:
    """Which task this is: the one row of ``spark.range`` its Spark partition holds (its input, read to the end)."""
    ids = [i for batch in inputs for i in batch.column(0).to_pylist()]
    if len(ids) != 1:
        raise ShaleError(f"an ingest task expects one task index as its input, got {ids[:5]}")
    return int(ids[0])


def make_task(spec: GroupSpec, plan: BatchPlan, bound: int, records: Records) -> Callable[
        [Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function Spark runs per task, on its index. It returns one row with the chunks it wrote (``written``:
    ``encode_written``'s JSON of their ``Written`` records), and one per paused partition (``paused``: a ``Paused``
    record as JSON).
    ``bound`` is the memory the task process may use (``ingest.max_task_bytes``)."""

    def task(inputs: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        batches = records(task_index(inputs))
        failpoint("ingest.task")
        release_free_memory()  # a reused worker starts from what it really holds, not an earlier task's peak
        with counting_requests() as requests, PeakMemory() as memory:
            def resize(held: int) -> int:
                # What the process keeps after a chunk (allocator caches, fragments of earlier tasks in a reused
                # worker) counts against the bound: measure it again, without the chunk still pending.
                release_free_memory()
                return chunk_bytes(bound, PeakMemory.resident() - held, spec.group)

            writer = ChunkWriter(spec, task_bucket(spec.bucket), plan, resize(0), resize=resize, pausable=True)
            written = []
            for batch in _timed(batches, writer.spent):
                written += writer.add(batch)
            written += writer.finish()
        rows = [{"written": encode_written([w.model_copy(update={"peak_rss": memory.peak}) for w in written]),
                 "paused": None, "requests": None}] if written else []
        rows += [{"written": None, "paused": p.model_dump_json(), "requests": None} for p in writer.pauses]
        if requests[0].counts:
            rows.append({"written": None, "paused": None, "requests": requests[0].model_dump_json()})
        if rows:
            yield pa.RecordBatch.from_pylist(rows, schema=TASK_RESULT)

    return task


WARM_SCHEMA = "records long, seconds string, requests string"
"""What a warm-up task returns: the records it rehearsed with, its seconds by phase (``PHASES``, JSON) and the
``RequestReport`` of the real bucket's requests (JSON; the scratch bucket's are not counted)."""


def make_warm_task(spec: GroupSpec, plan: BatchPlan, bound: int, records: Records) -> Callable[
        [Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function of the driver's warm-up read (before its lease): an ingest task's once-per-process costs, paid
    in each Python worker Spark starts (workers are reused by the batches): the imports, the topic's parser, the
    first normalizing, parsing and Parquet encoding, on the records ``plan`` names (the last few of each
    partition), written to a scratch bucket in the worker's memory that is dropped afterwards (nothing is written
    to the real bucket), and the real bucket's client with a connection (one HEAD of a key that does not exist)."""

    def warm(inputs: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        batches = records(task_index(inputs))
        bucket = task_bucket(spec.bucket)
        with counting_requests() as requests, contextlib.suppress(ShaleError):
            bucket.head("shale-warm-up-probe")  # NotFoundError as expected; a bucket's trouble shows in the batches
        writer = ChunkWriter(spec, scratch_bucket(), plan, chunk_bytes(bound, PeakMemory.resident(), spec.group))
        count = 0
        written = []
        for batch in _timed(batches, writer.spent):
            count += batch.num_rows
            written += writer.add(batch)
        written += writer.finish()
        yield pa.RecordBatch.from_pylist(
            [{"records": count, "seconds": json.dumps(phase_sums(written)), "requests": requests[0].model_dump_json()}],
            schema=pa.schema([("records", pa.int64()), ("seconds", pa.string()), ("requests", pa.string())]))

    return warm


def phase_sums(written: list[Written]) -> dict[str, float]:
    """Task time by phase (``PHASES``), summed over chunks (tasks run two or more at a time)."""
    sums: dict[str, float] = {}
    for w in written:
        for phase, seconds in w.seconds.items():
            sums[phase] = sums.get(phase, 0.0) + seconds
    return {phase: round(seconds, 3) for phase, seconds in sorted(sums.items())}


def start_worker(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A Spark Python worker's first job when there is nothing to rehearse on: import what an ingest task imports
    (the worker is reused by batches)."""
    yield from batches
