"""Which blocks no commit can ever claim: the rule by which the leader's bucket scan collects uncommitted blocks
(a second ingest process that lost, a rejected commit, outputs of a compaction job that is gone).

The rule is judged only for a block that is complete, older than the sync delay, not marked, and neither in the
index nor tombstoned, and only with a ``Claims`` read *after* the bucket was listed: a block committed after the
listing is then indexed in that read, or still claimable by it. ``unclaimed`` is pure. The ingest driver applies it
too, right after its commit, to a lost batch's blocks (``shale.ingest.orphans``): there the block being one no
commit holds follows from its overlap with offsets the driver committed in other blocks, and the claims are the
driver's own committed offsets, the metastore's or behind them (which only makes the rule keep more).

* A level-0 block (ingest or reprocess output) is claimable while some range ``r`` of it can still start a commit
  of its key (group, generation, topic, partition): the key has no committed offsets yet; or ``r`` is of the key's
  current incarnation (``''`` matches it) and starts at or after the committed end (the next commit starts at the
  end, and commits waiting in the dead letter queue follow it); or ``r`` is of an incarnation the metastore has
  never seen (a recreated topic's first commit may start anywhere). A range of an ended incarnation, or one that
  starts below the committed end, can never be committed again: those offsets were committed by other blocks.
* A compaction output (level > 0) is claimable while a compaction job whose sources are the output's parents
  exists: only its report can commit it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from shale.block import BlockMeta, KafkaRange
from shale.index import IncarnationRow, OffsetRow

OffsetKey = tuple[str, int, str, int]
"""(group, generation, topic, partition)"""


@dataclass(frozen=True)
class Claims:
    """What can still commit a block: per key the committed end and current incarnation, per key the ended
    incarnations, and the source sets of the compaction jobs that exist."""

    committed: Mapping[OffsetKey, tuple[int, str]]
    ended: Mapping[OffsetKey, frozenset[str]]
    jobs: frozenset[frozenset[str]]

    @staticmethod
    def of(offsets: Collection[OffsetRow], incarnations: Collection[IncarnationRow],
           job_sources: Collection[Collection[str]]) -> Claims:
        ended: dict[OffsetKey, set[str]] = {}
        for row in incarnations:
            ended.setdefault((row.group, row.generation, row.topic, row.partition), set()).add(row.incarnation)
        return Claims(
            committed={(o.group, o.generation, o.topic, o.partition): (o.committed_end, o.incarnation)
                       for o in offsets},
            ended={k: frozenset(v) for k, v in ended.items()},
            jobs=frozenset(frozenset(s) for s in job_sources))


def _range_claim(meta: BlockMeta, r: KafkaRange, claims: Claims) -> str | None:
    """None if a commit can still take ``r``; else why not."""
    key = (meta.group, meta.generation, r.topic, r.partition)
    committed = claims.committed.get(key)
    if committed is None:
        return None
    end, current = committed
    if r.incarnation and current and r.incarnation != current:
        if r.incarnation in claims.ended.get(key, frozenset()):
            return f"{r.topic}[{r.partition}] incarnation {r.incarnation} has ended (the topic was recreated)"
        return None
    if r.start >= end:
        return None
    return f"offsets [{r.start},{min(r.end, end)}) of {r.topic}[{r.partition}] were committed by other blocks"


def unclaimed(meta: BlockMeta, claims: Claims) -> str | None:
    """Why no commit can ever claim ``meta``, a block the index neither holds nor tombstoned; None while one
    still can (and for a level-0 block without Kafka ranges, which this rule cannot judge)."""
    if meta.level > 0:
        if frozenset(meta.compaction.parents) in claims.jobs:
            return None
        return "uncommitted compaction output: no compaction job of its parents exists"
    reasons = [_range_claim(meta, r, claims) for r in meta.kafka]
    if not reasons or any(why is None for why in reasons):
        return None
    return f"uncommitted: {'; '.join(str(why) for why in reasons)}"
