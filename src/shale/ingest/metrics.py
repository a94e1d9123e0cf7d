"""Prometheus metrics of the ingest groups (documented in docs/METRICS.md)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

RECORDS = Counter("shale_ingest_records_total", "Kafka records persisted (quarantined ones included).", ["group"])
BYTES = Counter("shale_ingest_bytes_total", "Bytes of Kafka record values persisted.", ["group"])
BLOCKS = Counter("shale_ingest_blocks_total", "Blocks written and committed.", ["group"])
QUARANTINED = Counter("shale_ingest_quarantined_total", "Records a parser rejected, kept in quarantine.", ["group"])
TOPIC_RECORDS = Counter("shale_ingest_topic_records_total", "Kafka records persisted per topic (quarantined ones "
                        "included).", ["group", "topic"])
TOPIC_QUARANTINED = Counter("shale_ingest_topic_quarantined_total", "Records quarantined per topic.",
                            ["group", "topic"])
QUARANTINING = Gauge("shale_ingest_quarantining", "1 when the topic's last batch sent all its records, or more "
                     "than ingest.quarantine_warn_share of them, to quarantine.", ["group", "topic"])
BATCHES = Counter("shale_ingest_batches_total", "Micro-batches by outcome: committed, replayed, dead-lettered, "
                  "empty, paused (every partition read paused on the Schema Registry: nothing to commit).",
                  ["group", "outcome"])
LAG = Gauge("shale_ingest_lag_records", "Records in Kafka beyond the committed offset.",
            ["group", "topic", "partition"])
DLQ_PENDING = Gauge("shale_ingest_dlq_pending", "1 while this group's commits are going to the dead letter queue.",
                    ["group"])
LAST_COMMIT = Gauge("shale_ingest_last_commit_timestamp_seconds", "When the last batch was made durable.", ["group"])
SKIPPED = Counter("shale_ingest_skipped_offsets_total", "Committed offsets that held no record a read_committed "
                  "consumer sees (transaction markers, aborted records, offsets removed by log compaction).", ["group"])
LOST = Gauge("shale_ingest_lost_offsets", "Offsets Kafka deleted before they were read, per partition, until an "
             "operator acknowledges the loss (the partition waits meanwhile).", ["group", "topic", "partition"])
PAUSED = Gauge("shale_ingest_paused_partitions", "Partitions not read, by reason: lost (offsets deleted before "
               "they were read), ahead (the committed end is beyond Kafka's end) or registry (a writer schema not "
               "cached and the Schema Registry did not answer).", ["group", "reason"])
REGISTRY_FAILURES = Counter("shale_ingest_registry_failures_total", "Times a partition paused because the Schema "
                            "Registry did not answer for a schema its task had not cached (refused, timed out, 5xx, "
                            "401/403).", ["group"])
TASK_PEAK_RSS = Gauge("shale_ingest_task_peak_rss_bytes", "Peak resident memory of a task process of the last "
                      "batch (bounded by ingest.max_task_bytes).", ["group"])
ORPHANS = Counter("shale_ingest_lost_batch_blocks_marked_total", "Blocks of batches that never committed (a driver "
                  "killed, a batch failed) that the driver marked for deletion right after its commit took their "
                  "offsets again.", ["group"])
FAILED = Counter("shale_ingest_batch_failures_total", "Batches that failed before their commit and were planned "
                 "again (Kafka or the object store unavailable, offsets deleted while reading).", ["group"])
TASK_SECONDS = Counter("shale_ingest_task_seconds_total", "Seconds the batches' Spark tasks spent, by phase: wait "
                       "(for the task's Kafka consumer's next records), normalize, encode (parse, Parquet, checksums), "
                       "upload (object-store requests); summed over tasks that run in parallel.", ["group", "phase"])
BATCH_SECONDS = Counter("shale_ingest_batch_seconds_total", "Seconds of the driver's batch loop, by phase: plan "
                        "(asking Kafka and the metastore), spark (the batch's Spark job), commit.", ["group", "phase"])
