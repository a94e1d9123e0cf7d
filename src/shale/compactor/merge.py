"""The merge a compaction job runs (in a Spark task): read the sources' datasets, merge matching datasets,
sort, drop copies of one record, and write one output block with the block writer.

Copies are dropped only where two sources' metadata says they may hold one record (``shale.block.records``:
the same topic incarnation and intersecting offsets), keyed by (incarnation, topic, partition, offset); a
recreated topic's offset 0 is another record than the old topic's. Elsewhere every row is kept, and the
metastore then requires as many rows out as in.

Memory: the merge holds its decoded input, the sort order (computed from the key columns alone) and one output
row group at a time, gathered from the input by the order and encoded at once (``write_block_streamed``); never
a sorted copy of the whole input.

The output's ULID time is the oldest source's (seed 004); its random part is derived from the job, the fencing
token and the sources, so a retried report of one attempt names the same block, while a stale attempt's output
never collides with the current owner's. The output lists, as ``compaction.sources``, the level-0 blocks whose
records it holds (seed 000's full-overlap rule) and, as ``parents``, the blocks it replaces.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shale.block import (
    DEFAULT_ROW_GROUP_ROWS,
    INCARNATION_COLUMN,
    BlockMeta,
    BlockSpec,
    Dataset,
    DatasetStream,
    IncarnationCodes,
    KafkaRange,
    block_file_key,
    deterministic_block_id,
    read_dataset,
    row_incarnation_names,
    row_incarnations,
    shared_scopes,
    write_block_streamed,
)
from shale.errors import IncompatibleColumnError
from shale.failpoints import failpoint
from shale.objstore import Bucket
from shale.resources import PeakMemory

READ_THREADS = 8


@dataclass
class MergeResult:
    output: BlockMeta
    rows_in: int
    rows_out: int
    bytes_in: int
    bytes_out: int
    peak_rss: int
    peak_rss_delta: int
    peak_arrow_bytes: int
    seconds: float


def output_id(sources: list[BlockMeta], job: str, token: int) -> str:
    oldest = min(s.time_ms for s in sources)
    return deterministic_block_id(oldest, f"compaction/{job}/{token}/{','.join(sorted(s.id for s in sources))}")


def merge_ranges(ranges: list[KafkaRange]) -> list[KafkaRange]:
    """The union of offset ranges per topic-partition and topic incarnation, as few ranges as possible."""
    by_tp: dict[tuple[str, int, str], list[tuple[int, int]]] = defaultdict(list)
    for r in ranges:
        by_tp[(r.topic, r.partition, r.incarnation)].append((r.start, r.end))
    out: list[KafkaRange] = []
    for (topic, partition, incarnation), spans in sorted(by_tp.items()):
        spans.sort()
        start, end = spans[0]
        for s, e in spans[1:]:
            if s <= end:
                end = max(end, e)
            else:
                out.append(KafkaRange(topic=topic, partition=partition, start=start, end=end, incarnation=incarnation))
                start, end = s, e
        out.append(KafkaRange(topic=topic, partition=partition, start=start, end=end, incarnation=incarnation))
    return out


def _common(values: list[dict[str, str]]) -> dict[str, str]:
    first = dict(values[0]) if values else {}
    return {k: v for k, v in first.items() if all(other.get(k) == v for other in values[1:])}


def _time_column(table: pa.Table) -> str:
    return "event_time" if "event_time" in table.column_names else "timestamp"


def merge_order(table: pa.Table, incarnations: np.ndarray | None = None) -> pa.Array:
    """The rows of ``table`` to write, in order: sorted by (time, topic, partition, offset). With
    ``incarnations`` (a code per row, ``shale.block.records``), of rows with equal (incarnation, topic,
    partition, offset) the first is kept: the same Kafka record stored twice has the same time, so copies are
    neighbours after the sort. Only the key columns are sorted and compared."""
    time_column = _time_column(table)
    names = [time_column, "topic", "partition", "offset"]
    keys = table.select(names)
    if incarnations is not None:
        keys = keys.append_column("incarnation", pa.array(incarnations, pa.int64()))
        names.append("incarnation")
    order = pc.sort_indices(keys, sort_keys=[(name, "ascending") for name in names])
    n = len(order)
    if n > 1 and incarnations is not None:
        keys = keys.take(order)
        same = pc.equal(keys.column("offset").slice(1), keys.column("offset").slice(0, n - 1))
        for name in ("partition", "topic", "incarnation"):
            same = pc.and_(same, pc.equal(keys.column(name).slice(1), keys.column(name).slice(0, n - 1)))
        keep = pa.concat_arrays([pa.array([True]), pc.invert(same).combine_chunks()])
        if not pc.all(keep).as_py():
            order = order.filter(keep)
    return order


def _sorted_row_groups(table: pa.Table, order: pa.Array, rows: int = DEFAULT_ROW_GROUP_ROWS) -> Iterator[pa.Table]:
    """``table.take(order)``, one row group at a time. Arrow's take on a table of many chunks first concatenates
    each column whole (a copy of the input per call), so each row group is taken from a window of its own: from
    each record batch, the span between the first and the last of its rows in this group (sources sorted by time
    give spans about as long as their share of the group), or just those rows when they are spread thinner than
    one in two. The window is at most two row groups, copied once; the take is the second and last copy."""
    batches = [b for b in table.to_batches() if b.num_rows]
    starts = np.cumsum([0] + [b.num_rows for b in batches])
    for first in range(0, len(order), rows):
        wanted = order.slice(first, rows).to_numpy().astype(np.int64)
        owner = np.searchsorted(starts, wanted, side="right") - 1
        pieces: list[pa.RecordBatch] = []
        index = np.empty(len(wanted), dtype=np.int64)
        size = 0
        for batch in np.unique(owner):
            where = np.flatnonzero(owner == batch)
            local = wanted[where] - starts[batch]
            low, high = int(local.min()), int(local.max()) + 1
            if high - low <= 2 * len(where):
                pieces.append(batches[batch].slice(low, high - low))
                index[where] = size + local - low
                size += high - low
            else:
                pieces.append(batches[batch].take(pa.array(local)))
                index[where] = size + np.arange(len(where))
                size += len(where)
        window = pa.Table.from_batches(pieces, schema=table.schema).combine_chunks()
        yield window.take(pa.array(index))


def fetch_sources(bucket: Bucket, sources: list[BlockMeta], pool: Executor) -> dict[str, Future[bytes]]:
    """Start the GETs of every data object of ``sources`` in ``pool``, by key: a task fetches its next merge's
    input while the current merge runs (the bytes are checked against their CRC32 when the merge reads them)."""
    keys = {block_file_key(m, d.file) for m in sources for d in m.datasets}
    return {key: pool.submit(bucket.get, key) for key in sorted(keys)}


def _check_types(name: str, parts: list[tuple[BlockMeta, Dataset]], tables: list[pa.Table]) -> None:
    """Refuse (with the column, its types and the blocks) to merge a dataset whose sources hold a column under types
    no one type holds: a schema changed incompatibly between them (DESIGN 10.8). Nothing is written; the job fails
    and, after the failure limit, is excluded, and the sources stay as they are."""
    if len(tables) < 2:
        return
    try:
        pa.unify_schemas([t.schema for t in tables], promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        seen: dict[str, tuple[pa.DataType, str]] = {}
        for (meta, _), table in zip(parts, tables, strict=True):
            for f in table.schema:
                first = seen.setdefault(f.name, (f.type, meta.id))
                try:
                    pa.unify_schemas([pa.schema([pa.field(f.name, first[0])]), pa.schema([f])],
                                     promote_options="permissive")
                except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
                    raise IncompatibleColumnError(
                        f"dataset {name}: column {f.name!r} is {first[0]} in block {first[1]} and {f.type} in block "
                        f"{meta.id}: the schema changed incompatibly between them, so they are not merged "
                        "(`shale reprocess --schema-id` can read the older blocks again as the new schema)") from None
        raise IncompatibleColumnError(f"dataset {name}: the sources' schemas cannot be merged: {exc}") from None


def _keeps_incarnations(sources: list[BlockMeta], parts: list[tuple[BlockMeta, Dataset]]) -> bool:
    """Whether a merged dataset names each row's incarnation (``shale.block.records.INCARNATION_COLUMN``): a
    backup dataset whose topic has ranges of two incarnations among the sources."""
    meta, dataset = parts[0]
    if meta.group != "backup" or dataset.kind != "records":
        return False
    return len({r.incarnation for m in sources for r in m.kafka if r.topic == dataset.topic}) > 1


def _with_incarnations(meta: BlockMeta, topic: str, table: pa.Table) -> pa.Table:
    names = row_incarnation_names(meta, topic, table)
    if INCARNATION_COLUMN in table.column_names:
        return table.set_column(table.column_names.index(INCARNATION_COLUMN), INCARNATION_COLUMN, names)
    return table.append_column(INCARNATION_COLUMN, names)


def merge_blocks(bucket: Bucket, sources: list[BlockMeta], *, job: str, token: int, level: int,
                 fetched: dict[str, Future[bytes]] | None = None, erased: list[str] | None = None) -> MergeResult:
    """Merge ``sources`` into one output block of ``level + 1``. ``fetched`` holds the input objects whose GETs
    were started already (``fetch_sources``); each is taken out of it when read, so its bytes go once decoded.
    ``erased``: the erasures none of the sources holds a record of, as the metastore assigned the job."""
    failpoint("compaction.merge")
    fetched = fetched if fetched is not None else {}

    def read(part: tuple[BlockMeta, Dataset]) -> pa.Table:
        meta, dataset = part
        early = fetched.pop(block_file_key(meta, dataset.file), None)
        return read_dataset(bucket, meta, dataset, data=early.result() if early is not None else None)

    started = time.perf_counter()
    with PeakMemory() as rss:
        parts: dict[str, list[tuple[BlockMeta, Dataset]]] = defaultdict(list)
        for meta in sources:
            for dataset in meta.datasets:
                parts[dataset.name].append((meta, dataset))
        streams: list[DatasetStream] = []
        rows_in = 0
        shared = shared_scopes(sources)
        codes = IncarnationCodes()
        for name in sorted(parts):
            with ThreadPoolExecutor(READ_THREADS) as pool:  # object reads overlap; Arrow decodes without the GIL
                tables = list(pool.map(read, parts[name]))
            rows_in += sum(t.num_rows for t in tables)
            if _keeps_incarnations(sources, parts[name]):
                tables = [_with_incarnations(meta, dataset.topic, t)
                          for (meta, dataset), t in zip(parts[name], tables, strict=True)]
            incarnations = None
            if any(topic == parts[name][0][1].topic for topic, _, _ in shared):
                incarnations = np.concatenate([
                    row_incarnations(meta, dataset.topic, t.column("partition"), t.column("offset"), codes)
                    for (meta, dataset), t in zip(parts[name], tables, strict=True)])
            _check_types(name, parts[name], tables)
            table = pa.concat_tables(tables, promote_options="permissive") if len(tables) > 1 else tables[0]
            del tables
            labels = sorted({tuple(sorted(ls.items())) for _, d in parts[name] for ls in d.labels})
            first = parts[name][0][1]
            # The sources' metadata times are bounded already (ingest clamps out-of-range record times); the
            # output's stay within theirs, so compaction never widens a block's data-time range.
            clamp = (min(d.min_time for _, d in parts[name]), max(d.max_time for _, d in parts[name]))
            streams.append(DatasetStream(first.kind, first.topic, table.schema,
                                         _sorted_row_groups(table, merge_order(table, incarnations)),
                                         _time_column(table),
                                         labels=[dict(ls) for ls in labels], clamp=clamp,
                                         # typed parsers: every writer schema of the sources; the newest
                                         # source's fingerprint (its columns are the merged table's newest)
                                         schema_ids=sorted({i for _, d in parts[name] for i in d.schema_ids or []}),
                                         schema_fingerprint=next((d.schema_fingerprint for _, d in
                                                                  reversed(parts[name]) if d.schema_fingerprint),
                                                                 ""),
                                         # a record type's parts share its dataset name: merged per type, never
                                         # across types (their columns are unrelated)
                                         record=first.record))
        head = sources[0]
        parsers = {(m.parser.name, m.parser.version, m.parser.options_digest) if m.parser else None for m in sources}
        spec = BlockSpec(
            id=output_id(sources, job, token), tenant=head.tenant, group=head.group, generation=head.generation,
            shard=head.shard, level=level + 1, kafka=merge_ranges([r for m in sources for r in m.kafka]),
            partition_values=_common([m.partition_values for m in sources]),
            sources=sorted({s for m in sources for s in m.compaction.sources}),
            parents=sorted(m.id for m in sources),
            parser=head.parser if len(parsers) == 1 else None,
            derived_from=sorted({d for m in sources for d in m.derived_from}),
            erased=erased)
        output = write_block_streamed(bucket, spec, streams)
    return MergeResult(output, rows_in, output.rows, sum(m.size for m in sources), output.size,
                       rss.peak, rss.peak - rss.start, rss.arrow_peak - rss.arrow_start, time.perf_counter() - started)
