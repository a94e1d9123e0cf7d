"""Recovering a block whose meta.json was lost, from its data objects' footers (seed 004's object footer).

Every data object carries the block's metadata, as planned before the upload, and the CRC32 of those bytes. A
block without a loadable meta.json (Partial) is recoverable when every dataset its footer names is present,
every object carries the same footer with a matching CRC, and the footer names this block: its meta.json is then
the footer's metadata with the objects' sizes and CRC32s as they are in the bucket. The data itself is checked
as any read checks it (Parquet page checksums). Written last, as by the writer (put-if-absent), the block is
whole again; without the metastore's index it is then judged like any other block (indexed, claimable by a
commit, adopted by a rebuild, or garbage).
"""

from __future__ import annotations

from collections.abc import Sequence

from shale.block.layout import META_FILENAME, block_prefix
from shale.block.meta import BlockMeta, FileInfo, parse_meta
from shale.block.reader import footer_bytes
from shale.block.writer import crc32_hex
from shale.errors import CorruptObjectError, NotFoundError
from shale.objstore import BucketReader, ObjectInfo


def recover_meta(bucket: BucketReader, tenant: str, block_id: str,
                 objects: Sequence[ObjectInfo]) -> tuple[BlockMeta | None, str]:
    """The block's metadata rebuilt from its objects' footers, or None and why it cannot be."""
    data = {name: o for o in objects if (name := o.key.rsplit("/", 1)[1]) != META_FILENAME}
    if not data:
        return None, "no data objects"
    footers = set()
    try:
        for name, info in sorted(data.items()):
            raw, checked = footer_bytes(bucket, info.key, info.size)
            if not checked:
                return None, f"{name}: its footer has no CRC32 (written before footers carried one)"
            footers.add(raw)
    except (CorruptObjectError, NotFoundError, OSError, ValueError) as exc:
        return None, f"a footer cannot be read: {exc}"
    if len(footers) != 1:
        return None, "the objects' footers differ"
    try:
        meta = parse_meta(footers.pop(), where=f"{tenant}/{block_id} footer", block_id=block_id)
    except CorruptObjectError as exc:
        return None, str(exc)
    if meta.tenant != tenant:
        return None, f"the footer names tenant {meta.tenant!r}"
    if any(not o.key.startswith(block_prefix(meta)) for o in data.values()):
        return None, f"the footer places the block under {block_prefix(meta)}, not where its objects are"
    missing = sorted({d.file for d in meta.datasets} - set(data))
    if missing:
        return None, f"objects {missing} are missing"
    files = []
    for d in meta.datasets:
        body = bucket.get(data[d.file].key)
        files.append(FileInfo(name=d.file, size=len(body), crc32=crc32_hex(body)))
    return meta.model_copy(update={"files": files}), "recovered from its objects' footers"
