"""Reading blocks: metadata, and datasets with their checksums checked.

Whole-object reads check the CRC32 in meta.json. Ranged reads (only the columns and row groups a query needs)
cannot check a whole-object checksum, so they check Parquet's page checksums instead, which the writer always
writes.
"""

from __future__ import annotations

import io
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shale.block.bloom import KEY_COLUMN, bitset_holds, bitset_of
from shale.block.layout import Placed, block_file_key, meta_key
from shale.block.meta import BlockMeta, Dataset, parse_meta
from shale.block.records import INCARNATION_COLUMN
from shale.block.schemas import BACKUP_SCHEMA
from shale.block.writer import FOOTER_CRC_KEY, FOOTER_META_KEY, crc32_hex
from shale.errors import CorruptObjectError
from shale.objstore import BucketReader


def read_meta(bucket: BucketReader, block: Placed) -> BlockMeta:
    """The meta.json the bucket holds for ``block`` (whose keys its metadata gives)."""
    key = meta_key(block)
    return parse_meta(bucket.get(key), where=key, block_id=block.id)


READ_BLOCK = 1 << 20
"""A ranged read fetches whole aligned blocks of this many bytes (what one request costs in bytes, about)."""
READ_AHEAD_BLOCKS = 16
"""The most blocks a ranged read fetches past what it was asked for, once reads go forward block after block."""
KEPT_BLOCKS = 32
"""The blocks a ``BucketFile`` keeps, least recently used dropped first: its memory, at most."""


class BucketFile(io.RawIOBase):
    """A read-only, seekable file over one object, reading byte ranges on demand (for pyarrow), in blocks.

    Parquet asks for each wanted column chunk of each row group on its own, several columns' chunks in turn: a
    level-0 object holds a row group per Kafka partition, so a query of three columns on a block of 2,048
    partitions asked 8,194 ranges, a request each (73 s for six such blocks on MinIO; issue 55). So reads fetch
    whole aligned ``READ_BLOCK``-byte blocks and keep the last ``KEPT_BLOCKS``: the column chunks of neighbouring
    row groups come from the same blocks. A miss fetches the run of missing blocks it spans in one request, and
    while reads go forward (the block before the miss is kept) as many blocks again past it, doubling up to
    ``READ_AHEAD_BLOCKS``; a jump elsewhere fetches only what it spans."""

    def __init__(self, bucket: BucketReader, key: str, size: int) -> None:
        self._bucket, self._key, self._size, self._pos = bucket, key, size, 0
        self._blocks: OrderedDict[int, bytes] = OrderedDict()
        self._ahead = 0
        self.bytes_read = 0
        self.requests = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        start, end = self._pos, min(self._size, self._pos + len(view))
        if end <= start:
            return 0
        first, last = start // READ_BLOCK, (end - 1) // READ_BLOCK
        blocks = {b: self._blocks[b] for b in range(first, last + 1) if b in self._blocks}
        for b in blocks:
            self._blocks.move_to_end(b)
        missing = [b for b in range(first, last + 1) if b not in blocks]
        if missing:
            self._ahead = min(READ_AHEAD_BLOCKS, max(1, self._ahead * 2)) if first - 1 in self._blocks else 0
            blocks |= self._fetch(missing)
        written = 0
        for b in range(first, last + 1):
            piece = blocks[b][max(start, b * READ_BLOCK) - b * READ_BLOCK:min(end, (b + 1) * READ_BLOCK)
                              - b * READ_BLOCK]
            view[written:written + len(piece)] = piece
            written += len(piece)
        self._pos = end
        return written

    def _fetch(self, missing: list[int]) -> dict[int, bytes]:
        """The missing blocks (and the read-ahead past the last), a request per run of consecutive ones."""
        count = -(-self._size // READ_BLOCK)
        tail = missing[-1]
        while tail + 1 < count and tail + 1 - missing[-1] <= self._ahead and tail + 1 not in self._blocks:
            tail += 1
        wanted = missing + list(range(missing[-1] + 1, tail + 1))
        fetched: dict[int, bytes] = {}
        runs: list[list[int]] = []
        for b in wanted:
            if runs and runs[-1][-1] == b - 1:
                runs[-1].append(b)
            else:
                runs.append([b])
        for run in runs:
            begin, stop = run[0] * READ_BLOCK, min(self._size, (run[-1] + 1) * READ_BLOCK)
            data = self._bucket.get_range(self._key, begin, stop)
            if len(data) != stop - begin:
                raise OSError(f"{self._key}: asked bytes [{begin}, {stop}) of a {self._size}-byte object, got "
                              f"{len(data)}")
            self.bytes_read += len(data)
            self.requests += 1
            for b in run:
                fetched[b] = data[(b - run[0]) * READ_BLOCK:(b - run[0] + 1) * READ_BLOCK]
        for b, data in fetched.items():
            self._blocks[b] = data
        while len(self._blocks) > KEPT_BLOCKS:
            self._blocks.popitem(last=False)
        return fetched


def _dataset(meta: BlockMeta, dataset: str | Dataset) -> Dataset:
    if isinstance(dataset, Dataset):
        return dataset
    for entry in meta.datasets:
        if entry.name == dataset:
            return entry
    raise KeyError(f"block {meta.tenant}/{meta.id} has no dataset {dataset!r}")


SMALL_OBJECT_BYTES = 1 << 20
"""With ``whole_object=None``, objects up to this size are read in one GET even when only some columns or rows
are wanted: below it, one request costs more than the bytes a ranged read would save (a Parquet read of a few
columns takes a request per column chunk), and the whole-object read also checks the object's CRC32."""


def read_dataset(
    bucket: BucketReader,
    meta: BlockMeta,
    dataset: str | Dataset,
    *,
    columns: Sequence[str] | None = None,
    filters: Any = None,
    whole_object: bool | None = True,
    data: bytes | None = None,
    row_groups: Sequence[int] | None = None,
) -> pa.Table:
    """One dataset's rows (only those of ``row_groups`` when given). ``whole_object`` fetches the object in one GET
    and checks its CRC32; ``False`` fetches only the needed byte ranges and checks Parquet page checksums; ``None``
    chooses by size (``SMALL_OBJECT_BYTES``). ``data`` is the whole object when the caller fetched it already; its
    CRC32 is checked all the same."""
    entry = _dataset(meta, dataset)
    key = block_file_key(meta, entry.file)
    info = meta.file(entry.file)
    if data is not None:
        whole_object = True  # fetched whole by the caller
    elif whole_object is None:
        whole_object = info.size <= SMALL_OBJECT_BYTES
    try:
        if whole_object:
            data = bucket.get(key) if data is None else data
            if len(data) != info.size or crc32_hex(data) != info.crc32:
                raise CorruptObjectError(
                    f"{key}: block {meta.tenant}/{meta.id} file {entry.file} is corrupt: {len(data)} bytes with "
                    f"CRC32 {crc32_hex(data)}, meta.json says {info.size} bytes with CRC32 {info.crc32}. "
                    "Run `shale bucket verify` and restore or re-ingest the block.",
                    key=key, block_id=meta.id)
            source: Any = pa.BufferReader(data if filters is None else arrow_owned(data))
        else:
            source = BucketFile(bucket, key, info.size)
        wanted = list(columns) if columns is not None else None
        if filters is None:  # a third less CPU than read_table, which goes through the datasets layer
            file = pq.ParquetFile(source, page_checksum_verification=True, pre_buffer=whole_object)
            return file.read(wanted) if row_groups is None else file.read_row_groups(row_groups, wanted)
        return pq.read_table(source, columns=wanted, filters=filters, page_checksum_verification=True,
                             pre_buffer=whole_object)
    except (OSError, pa.ArrowInvalid) as exc:
        raise CorruptObjectError(f"{key}: block {meta.tenant}/{meta.id} file {entry.file} cannot be read: {exc}",
                                 key=key, block_id=meta.id) from exc


def arrow_owned(data: bytes) -> pa.Buffer:
    """A copy of ``data`` in Arrow's memory. The datasets layer (``read_table`` with filters) can drop its last
    reference to the source on one of Arrow's pool threads after the read has returned; a buffer over a Python
    object then needs the GIL to be released, and at interpreter exit taking the GIL ends the thread inside a C++
    destructor: "terminate called without an active exception", exit 134 after a complete answer (seen in
    ``shale query``, found with gdb). Arrow's own memory is released without the GIL."""
    copy = pa.allocate_buffer(len(data))
    memoryview(copy).cast("B")[:] = data
    return copy


def footer_bytes(bucket: BucketReader, key: str, size: int) -> tuple[bytes, bool]:
    """The block metadata embedded in a data object's Parquet footer (a ranged read of its last 1 MiB block or
    two), and whether it carries its CRC32 (objects written before the footer had one do not). A CRC that does not
    match is a ``CorruptObjectError``."""
    metadata = pq.read_metadata(BucketFile(bucket, key, size)).metadata or {}
    raw = metadata.get(FOOTER_META_KEY)
    if raw is None:
        raise CorruptObjectError(f"{key}: no Shale metadata in the Parquet footer", key=key)
    crc = metadata.get(FOOTER_CRC_KEY)
    if crc is not None and crc.decode(errors="replace") != crc32_hex(raw):
        raise CorruptObjectError(f"{key}: the Shale metadata in the Parquet footer fails its CRC32", key=key)
    return raw, crc is not None


def read_footer_meta(bucket: BucketReader, key: str, size: int) -> BlockMeta:
    """The block metadata embedded in a data object's Parquet footer, its CRC32 checked when it has one."""
    return parse_meta(footer_bytes(bucket, key, size)[0], where=key)


RECENT_OBJECTS_BYTES = 32 << 20
"""What ``backup_rows`` keeps of the small objects it fetched whole, per process."""
_recent: OrderedDict[tuple[str, str, int, str], bytes] = OrderedDict()
_recent_size = [0]
_recent_lock = threading.Lock()


def _recent_small_object(bucket: BucketReader, meta: BlockMeta, dataset: Dataset) -> bytes | None:
    """The whole object of ``dataset`` when it is small enough to be fetched whole, from the process's recent
    fetches when it is there. Restore, reprocess and repair read a block of many partitions once per partition, in
    tasks that Spark runs one after the other in the same reused worker: without this, each fetched the same object
    again. Blocks are immutable and ``read_dataset`` checks the CRC32 of what it is given, so a hit is never a
    different object; bounded by ``RECENT_OBJECTS_BYTES``, least recently used dropped first."""
    info = meta.file(dataset.file)
    if info.size > SMALL_OBJECT_BYTES:
        return None
    key = block_file_key(meta, dataset.file)
    cache_key = (bucket.url, key, info.size, info.crc32)
    with _recent_lock:
        data = _recent.get(cache_key)
        if data is not None:
            _recent.move_to_end(cache_key)
            return data
    data = bucket.get(key)
    if len(data) != info.size or crc32_hex(data) != info.crc32:
        return data  # not kept: read_dataset reports the corruption
    with _recent_lock:
        if cache_key not in _recent:
            _recent[cache_key] = data
            _recent_size[0] += len(data)
        while _recent_size[0] > RECENT_OBJECTS_BYTES:
            _recent_size[0] -= len(_recent.popitem(last=False)[1])
    return data


def backup_rows(bucket: BucketReader, meta: BlockMeta, topic: str, partition: int, start: int,
                end: int, *, incarnations: bool = False) -> list[pa.Table]:
    """The rows of ``meta``'s records datasets of ``topic`` whose partition is ``partition`` and offset in
    [start, end), with the backup group's columns (and, with ``incarnations``, a merged dataset's
    ``INCARNATION_COLUMN`` where it has one: ``shale.block.records.row_incarnation_names``). Of a dataset whose
    row groups are per partition, only the partition's row groups are fetched."""
    tables = []
    for dataset in meta.datasets:
        if dataset.kind == "records" and dataset.topic == topic:
            if dataset.row_group_partitions is None:
                table = read_dataset(bucket, meta, dataset)
            else:
                groups = [i for i, p in enumerate(dataset.row_group_partitions) if p == partition]
                if not groups:
                    continue
                table = read_dataset(bucket, meta, dataset, row_groups=groups, whole_object=None,
                                     data=_recent_small_object(bucket, meta, dataset))
            offsets = table.column("offset")
            keep = pc.and_(pc.equal(table.column("partition"), partition),
                           pc.and_(pc.greater_equal(offsets, start), pc.less(offsets, end)))
            names = BACKUP_SCHEMA.names + ([INCARNATION_COLUMN] if incarnations and
                                           INCARNATION_COLUMN in table.column_names else [])
            tables.append(table.filter(keep).select(names))
    return tables


def may_hold_key(bucket: BucketReader, meta: BlockMeta, dataset: Dataset, key: bytes) -> bool:
    """Whether ``dataset`` may hold a row whose key is ``key``: False only when every row group has a key bloom
    filter that says no (the footer and the filters are read, never the data). A data object written before
    filters were, or any row group without one, may hold it."""
    object_key = block_file_key(meta, dataset.file)
    source = BucketFile(bucket, object_key, meta.file(dataset.file).size)
    metadata = pq.read_metadata(source)
    index = metadata.schema.names.index(KEY_COLUMN) if KEY_COLUMN in metadata.schema.names else -1
    if index < 0:
        return False  # no key column: no row has a key
    for group in range(metadata.num_row_groups):
        column = metadata.row_group(group).column(index)
        offset, length = column.bloom_filter_offset, column.bloom_filter_length
        if offset is None or not length:
            return True
        bitset = bitset_of(bucket.get_range(object_key, offset, offset + length))
        if bitset is None or bitset_holds(bitset, key):
            return True
    return False
