"""The completeness ledger: per (group, topic, dt, Kafka partition), the committed offset watermark and the
blocks that hold the day, so a downstream job can ask "is this day complete?" instead of guessing with a delay.

A day is complete for a topic when every Kafka partition's committed records have reached past the day's end
in event time (each partition's largest committed event time is at or after the next midnight, UTC) — the
watermark rule of stream processors, stated over what the metastore has committed.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from dataclasses import asdict, dataclass, field

from shale.verify.reconcile import StoredBlocks, erased_of, group_blocks


@dataclass
class PartitionWatermark:
    partition: int
    committed_end: int
    max_event_time: int
    incarnation: str = ""
    skipped: int = 0
    erased: int = 0
    """Committed offsets whose record an erasure removed (``shale erase``): erased, not missing."""
    erasures: list[str] = field(default_factory=list)


@dataclass
class DayEntry:
    dt: str
    blocks: list[str] = field(default_factory=list)
    rows: int = 0
    complete: bool = False


@dataclass
class Ledger:
    group: str
    generation: int
    topic: str
    partitions: list[PartitionWatermark]
    days: list[DayEntry]

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _day_end_ms(day: str) -> int:
    start = dt.datetime.strptime(day, "%Y-%m-%d").replace(tzinfo=dt.UTC)
    return int((start + dt.timedelta(days=1)).timestamp() * 1000)


def build_ledger(metastore: StoredBlocks, group: str, generation: int, topic: str, day: str | None = None) -> Ledger:
    offsets = [o for o in metastore.offsets(group, generation) if o.topic == topic]
    erased = erased_of(metastore, topic)
    watermarks = []
    for o in sorted(offsets, key=lambda o: o.partition):
        gone = {offset: e for offset, e in erased.get(o.partition, {}).items() if offset < o.committed_end}
        watermarks.append(PartitionWatermark(o.partition, o.committed_end, o.max_event_time, o.incarnation, o.skipped,
                                             len(gone), sorted(set(gone.values()))))
    days: dict[str, DayEntry] = defaultdict(lambda: DayEntry(""))
    for meta in group_blocks(metastore, group, generation, topic):
        for ds in meta.datasets:
            for label_set in ds.labels:
                value = label_set.get("dt")
                if value and (day is None or value == day):
                    entry = days[value]
                    entry.dt = value
                    if meta.id not in entry.blocks:
                        entry.blocks.append(meta.id)
                        entry.rows += ds.rows if meta.partition_values.get("dt") == value else 0
    low = min((w.max_event_time for w in watermarks), default=0)
    for entry in days.values():
        entry.complete = bool(watermarks) and low >= _day_end_ms(entry.dt)
    return Ledger(group, generation, topic, watermarks, sorted(days.values(), key=lambda e: e.dt))
