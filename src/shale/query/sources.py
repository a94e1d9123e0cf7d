"""Where a query finds its blocks: the metastore (linearizable, the default) or a tenant's bucket index
(one GET, no metastore needed)."""

from __future__ import annotations

from collections.abc import Sequence

from shale.block import BlockMeta
from shale.config import ShaleConfig
from shale.index import match_label_sets, parse_matchers
from shale.objstore import BucketReader
from shale.query.plan import BlockSource


class BucketIndexSource:
    """Blocks from the tenants' bucket indexes, pruned here by time and labels as the metastore would."""

    def __init__(self, reader: object) -> None:
        self.reader = reader

    def query_blocks(self, tenants: Sequence[str], start: int, end: int, selector: str = "",
                     group: str | None = None) -> list[BlockMeta]:
        matchers = parse_matchers(selector)
        out = []
        for tenant in tenants:
            for meta in self.reader.blocks(tenant):  # type: ignore[attr-defined]
                if group is not None and meta.group != group:
                    continue
                keep = [d for d in meta.datasets if d.max_time >= start and d.min_time <= end and match_label_sets(
                    [{"topic": d.topic, "kind": d.kind, "group": meta.group, **ls}
                     for ls in (d.labels or [{}])], matchers)]
                if keep:
                    out.append(meta if len(keep) == len(meta.datasets) else
                               meta.model_copy(update={"datasets": keep}))
        return out


def open_source(config: ShaleConfig, name: str, bucket: BucketReader) -> BlockSource:
    if name == "bucket-index":
        from shale.bucketindex import BucketIndexReader

        return BucketIndexSource(BucketIndexReader(bucket, config.bucket_index))
    from shale.metastore import open_metastore

    return open_metastore(config)
