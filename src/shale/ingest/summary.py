"""What each batch stored and quarantined, per topic: logged every batch, loud when a topic's records mostly go to
quarantine (a warning line, ``shale_ingest_quarantining`` and the ShaleIngestQuarantining alert), and summed for
the table ``shale ingest --available-now`` ends with."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

from shale.encoder import Written, top_reasons
from shale.ingest import metrics

log = logging.getLogger("shale.ingest.job")


@dataclass
class TopicTally:
    records: int = 0
    quarantined: int = 0
    reasons: Counter[str] = field(default_factory=Counter)

    @property
    def stored(self) -> int:
        """Records stored as data (not quarantined)."""
        return self.records - self.quarantined

    def add(self, written: Written) -> None:
        self.records += written.records
        self.quarantined += written.quarantined
        self.reasons.update(written.reasons)

    def top(self, n: int = 3) -> dict[str, int]:
        return top_reasons(self.reasons.items(), n)

    def alarming(self, share: float) -> bool:
        """Every record quarantined, or more than ``share`` of them."""
        return self.quarantined > 0 and (self.quarantined == self.records or self.quarantined > share * self.records)


def tally(written: list[Written]) -> dict[str, TopicTally]:
    topics: dict[str, TopicTally] = {}
    for w in written:
        topics.setdefault(w.topic, TopicTally()).add(w)
    return topics


@dataclass
class IngestSummary:
    """The per-topic totals of one ``shale ingest`` run."""

    group: str
    warn_share: float
    topics: dict[str, TopicTally] = field(default_factory=dict)

    def batch(self, written: list[Written]) -> None:
        """Log, count and sum one committed batch."""
        for topic, t in sorted(tally(written).items()):
            total = self.topics.setdefault(topic, TopicTally())
            total.records += t.records
            total.quarantined += t.quarantined
            total.reasons.update(t.reasons)
            metrics.TOPIC_RECORDS.labels(self.group, topic).inc(t.records)
            metrics.TOPIC_QUARANTINED.labels(self.group, topic).inc(t.quarantined)
            alarm = t.alarming(self.warn_share)
            metrics.QUARANTINING.labels(self.group, topic).set(1 if alarm else 0)
            extra: dict[str, object] = {"group": self.group, "topic": topic, "stored": t.stored,
                                        "quarantined": t.quarantined}
            if t.quarantined:
                extra["reasons"] = "; ".join(f"{n}x {reason}" for reason, n in t.top().items())
            log.info("topic batch", extra=extra)
            if alarm:
                share = "all" if t.quarantined == t.records else f"{t.quarantined} of {t.records}"
                log.warning(f"{share} records of this topic went to quarantine: check its [[ingest.parsers]] rule "
                            f"(shale config check) and read them with `shale query --quarantine`",
                            extra={"group": self.group, "topic": topic, "reasons": extra["reasons"]})

    def wholly_quarantined(self) -> list[str]:
        """Topics of which this run stored nothing but quarantined records: a parser rule that cannot work."""
        return sorted(topic for topic, t in self.topics.items() if t.records and t.quarantined == t.records)

    def table(self) -> str:
        """The run's per-topic table: stored, quarantined and the top reasons."""
        rows = [("topic", "stored", "quarantined", "top quarantine reasons")]
        for topic, t in sorted(self.topics.items()):
            reasons = "; ".join(f"{n}x {reason}" for reason, n in t.top(2).items()) or "-"
            mark = "  << WARNING" if t.alarming(self.warn_share) else ""
            rows.append((topic, str(t.stored), str(t.quarantined) + mark, reasons))
        if len(rows) == 1:
            return "nothing new to store"
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        return "\n".join(f"{r[0]:<{widths[0]}}  {r[1]:>{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}" for r in rows)
