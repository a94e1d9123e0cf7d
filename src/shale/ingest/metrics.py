"""Prometheus metrics of the ingest groups (documented in docs/METRICS.md)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

RECORDS = Counter("shale_ingest_records_total", "Kafka records persisted (quarantined ones included).", ["group"])
BYTES = Counter("shale_ingest_bytes_total", "Bytes of Kafka record values persisted.", ["group"])
BLOCKS = Counter("shale_ingest_blocks_total", "Blocks written and committed.", ["group"])
QUARANTINED = Counter("shale_ingest_quarantined_total", "Records a parser rejected, kept in quarantine.", ["group"])
BATCHES = Counter("shale_ingest_batches_total", "Micro-batches by outcome: committed, replayed, dead-lettered, "
                  "empty.", ["group", "outcome"])
LAG = Gauge("shale_ingest_lag_records", "Records in Kafka beyond the committed offset.",
            ["group", "topic", "partition"])
DLQ_PENDING = Gauge("shale_ingest_dlq_pending", "1 while this group's commits are going to the dead letter queue.",
                    ["group"])
LAST_COMMIT = Gauge("shale_ingest_last_commit_timestamp_seconds", "When the last batch was made durable.", ["group"])
