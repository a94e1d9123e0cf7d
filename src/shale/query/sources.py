"""Where a query finds its blocks: the metastore (linearizable, the default; in embedded mode a read-only view of
its state), or a tenant's bucket index (one GET, no metastore needed). Every source prunes datasets with the same
rule (``shale.index.matching_datasets``) and answers the tenant's generation switches, so every source returns the
same rows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from shale.block import BlockMeta
from shale.config import ShaleConfig
from shale.errors import ShaleError
from shale.index import matching_datasets, parse_matchers
from shale.objstore import BucketReader
from shale.query.plan import BlockSource


class IndexedBlocks(Protocol):
    """What this source reads (``shale.bucketindex.BucketIndexReader`` fits)."""

    def blocks(self, tenant: str) -> list[BlockMeta]: ...

    def full_meta(self, meta: BlockMeta) -> BlockMeta: ...

    def generations(self, tenant: str) -> list[tuple[str, int, int, int]] | None: ...


class BucketIndexSource:
    """Blocks and generation switches from the tenants' bucket indexes."""

    def __init__(self, reader: IndexedBlocks) -> None:
        self.reader = reader

    def query_blocks(self, tenants: Sequence[str], start: int, end: int, selector: str = "",
                     group: str | None = None) -> list[BlockMeta]:
        matchers = parse_matchers(selector)
        out = []
        for tenant in tenants:
            for meta in self.reader.blocks(tenant):
                if group is not None and meta.group != group:
                    continue
                keep = matching_datasets([(d.min_time, d.max_time, [
                    {"topic": d.topic, "kind": d.kind, "group": meta.group, **ls} for ls in (d.labels or [{}])])
                    for d in meta.datasets], start, end, matchers)
                if keep:
                    # Index entries leave out Kafka ranges (deduplication needs them) and row groups: the blocks
                    # selected are read in full, which costs a GET per block the first time only.
                    full = self.reader.full_meta(meta)
                    out.append(full if len(keep) == len(full.datasets) else
                               full.model_copy(update={"datasets": [full.datasets[i] for i in keep]}))
        return out

    def generation_rules(self, tenant: str) -> list[tuple[str, int, int, int]]:
        """The switches the metastore's index writer recorded. An index written from a bucket scan alone cannot
        know them: it is refused when its partition group holds more than one generation (a query could read the
        wrong one), and taken as "no switches" otherwise."""
        rules = self.reader.generations(tenant)
        if rules is not None:
            return rules
        found = {m.generation for m in self.reader.blocks(tenant) if m.group == "partition"}
        if len(found) > 1:
            raise ShaleError(
                f"tenant {tenant}'s bucket index was written from a bucket scan, which cannot see generation "
                f"switches, and its partition group holds generations {sorted(found)}: query through the "
                "metastore, or let the metastore leader write the index")
        return []


def open_source(config: ShaleConfig, name: str, bucket: BucketReader) -> BlockSource:
    if name == "bucket-index":
        from shale.bucketindex import BucketIndexReader

        return BucketIndexSource(BucketIndexReader(bucket, config.bucket_index))
    from shale.metastore import open_index_view

    return open_index_view(config)
