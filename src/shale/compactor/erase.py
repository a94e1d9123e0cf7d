"""The rewrite an erase job runs (``shale erase``, DESIGN 19), in a compaction worker's Spark task like a merge: its
one source block, every dataset of it (records and quarantine), written again without the rows at the erasure's
positions, as a new block that replaces the source through the compaction service's report.

A row is the record at a position when its topic, partition and offset are the position's and its incarnation is
too (a position or a row whose incarnation is not known matches any: an erasure must not leave a copy behind).
The output keeps the source's Kafka ranges (the erased offsets stay accounted for: they are erased, not missing),
level, group and generation, and its lineage plus its own id (``erased_lineage``: the rewrite supersedes its
source), and adds the erasure to ``erased``. Its id is derived from the job, the
fencing token and the source, as a merge output's is: a repeated report of one attempt names the same block, and a
stale attempt's output never collides with the current owner's.
"""

from __future__ import annotations

import time
from collections import defaultdict
from concurrent.futures import Future

import numpy as np
import pyarrow as pa

from shale.block import (
    DEFAULT_ROW_GROUP_ROWS,
    BlockMeta,
    BlockSpec,
    Dataset,
    DatasetStream,
    block_file_key,
    deterministic_block_id,
    read_dataset,
    row_incarnation_names,
    write_block_streamed,
)
from shale.compaction import ErasePlan
from shale.compactor.merge import MergeResult
from shale.failpoints import failpoint
from shale.objstore import Bucket
from shale.resources import PeakMemory


def erase_output_id(source: BlockMeta, erasure: str, job: str, token: int) -> str:
    return deterministic_block_id(source.time_ms, f"erasure/{erasure}/{job}/{token}/{source.id}")


def erased_lineage(source: BlockMeta, output_id: str) -> list[str]:
    """A rewrite's ``compaction.sources`` (an erase job's, a repair's rebuild of a damaged block): its source's and
    its own id. A strict superset of the source's, so
    seed 000's full-overlap rule (a bucket scanner's, ``shale.block.fetcher``; the bucket index's live blocks)
    judges the source overlapped by its rewrite while both are in the bucket unmarked; with equal sets the greater
    id would win, which may be the source's, still holding the erased records. Merges carry the id on like any
    source's."""
    return sorted({*source.compaction.sources, output_id})


def erased_rows(meta: BlockMeta, topic: str, table: pa.Table, positions: list[tuple[str, int, int, str]]) -> np.ndarray:
    """A boolean mask of the rows of ``table`` (``meta``'s dataset of ``topic``) at one of ``positions``."""
    mask = np.zeros(table.num_rows, dtype=bool)
    wanted: dict[int, dict[int, set[str]]] = defaultdict(dict)
    for t, partition, offset, incarnation in positions:
        if t == topic:
            wanted[partition].setdefault(offset, set()).add(incarnation)
    if not wanted or not table.num_rows:
        return mask
    part = np.asarray(table.column("partition").to_numpy(zero_copy_only=False), dtype=np.int64)
    off = np.asarray(table.column("offset").to_numpy(zero_copy_only=False), dtype=np.int64)
    for partition, offsets in wanted.items():
        mask |= (part == partition) & np.isin(off, np.fromiter(offsets, dtype=np.int64))
    hits = np.flatnonzero(mask)
    if len(hits):
        names = row_incarnation_names(meta, topic, table.take(pa.array(hits))).to_pylist()
        for hit, name in zip(hits, names, strict=True):
            incarnations = wanted[int(part[hit])][int(off[hit])]
            if "" in incarnations:
                continue
            if name is None:
                # The block cannot tell this row's incarnation (a partition-group merge of two incarnations whose
                # offsets overlap names none per row): it is erased only when every incarnation that may hold it
                # is wanted. Otherwise it may be another key's record of the other incarnation: it stays, and the
                # leftover scan (at the position) holds the receipt back rather than a record being lost.
                covering = {r.incarnation for r in meta.kafka if r.topic == topic and r.partition == int(part[hit])
                            and r.start <= int(off[hit]) < r.end}
                mask[hit] = bool(covering) and covering <= incarnations
            elif name not in incarnations:
                mask[hit] = False
    return mask


def _row_groups(table: pa.Table, rows: int = DEFAULT_ROW_GROUP_ROWS) -> list[pa.Table]:
    return [table.slice(start, rows) for start in range(0, table.num_rows, rows)]


def erase_block(bucket: Bucket, source: BlockMeta, plan: ErasePlan, *, job: str, token: int,
                fetched: dict[str, Future[bytes]] | None = None) -> MergeResult:
    """Write ``source`` again without the rows at ``plan``'s positions; the new block's metadata and counts."""
    failpoint("erasure.rewrite")
    fetched = fetched if fetched is not None else {}
    started = time.perf_counter()
    with PeakMemory() as rss:
        streams: list[DatasetStream] = []
        rows_in = 0
        for dataset in source.datasets:
            early = fetched.pop(block_file_key(source, dataset.file), None)
            table = read_dataset(bucket, source, dataset, data=early.result() if early is not None else None)
            rows_in += table.num_rows
            drop = erased_rows(source, dataset.topic, table, plan.positions)
            if drop.any():
                table = table.filter(pa.array(~drop))
            streams.append(_stream(dataset, table))
        output_id = erase_output_id(source, plan.erasure, job, token)
        spec = BlockSpec(
            id=output_id, tenant=source.tenant, group=source.group,
            generation=source.generation, shard=source.shard, level=source.level, kafka=list(source.kafka),
            partition_values=dict(source.partition_values), sources=erased_lineage(source, output_id),
            parents=[source.id], parser=source.parser, derived_from=list(source.derived_from),
            erased=sorted({*(source.erased or ()), plan.erasure}))
        failpoint("erasure.write")
        output = write_block_streamed(bucket, spec, streams)
    return MergeResult(output, rows_in, output.rows, source.size, output.size, rss.peak, rss.peak - rss.start,
                       rss.arrow_peak - rss.arrow_start, time.perf_counter() - started)


def _stream(dataset: Dataset, table: pa.Table) -> DatasetStream:
    time_column = "event_time" if "event_time" in table.column_names else "timestamp"
    return DatasetStream(dataset.kind, dataset.topic, table.schema, _row_groups(table), time_column,
                         labels=list(dataset.labels), clamp=(dataset.min_time, dataset.max_time),
                         schema_ids=list(dataset.schema_ids or []), schema_fingerprint=dataset.schema_fingerprint or "",
                         record=dataset.record)
