"""The issues' targets, each on one figure or ratio of a benchmark's result, declared once: ``write_result`` puts a
benchmark's targets, met or not, into its result, and docs/BENCHMARKS.md's targets table is generated from the
committed results (``python -m bench targets`` rewrites it; a unit test checks it is current). A target whose
result does not hold its figure yet (a benchmark not run since the target was set) shows as not measured."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

RESULTS = Path(__file__).parent / "results"
DOC = Path(__file__).parent.parent / "docs" / "BENCHMARKS.md"
MARKERS = ("<!-- targets -->", "<!-- /targets -->")


@dataclass(frozen=True)
class Target:
    bench: str
    key: str
    """``ratios.<name>`` or ``figures.<name>`` of the benchmark's result."""
    op: Literal[">=", "<="]
    value: float
    what: str

    def measured(self, result: dict[str, Any]) -> float | None:
        section, _, name = self.key.partition(".")
        value = result.get(section, {}).get(name)
        return None if value is None else float(value)

    def met(self, value: float) -> bool:
        return value >= self.value if self.op == ">=" else value <= self.value


TARGETS = [
    Target("fetcher_sync", "ratios.calls", ">=", 1.0, "fetcher sync: fewer calls than LIST + GET every meta.json"),
    Target("fetcher_sync", "ratios.seconds", ">=", 1.0, "fetcher sync: faster than LIST + GET every meta.json"),
    Target("metastore", "figures.add_blocks_per_s_single_batched", ">=", 20_000,
           "metastore, one node, batched `AddBlocks`, blocks/s"),
    Target("metastore", "ratios.add_batched_vs_plain", ">=", 0.7,
           "metastore, one node, batched `AddBlocks` against plain SQLite in the same run (issue 17)"),
    Target("metastore", "figures.add_blocks_per_s_raft3_batched", ">=", 2_000,
           "metastore, 3-node Raft, batched, blocks/s"),
    Target("metastore", "ratios.durable_vs_before", ">=", 0.8,
           "metastore, 3-node Raft with durable state against before, same run (issue 44)"),
    Target("metastore", "figures.query_p99_ms_1m", "<=", 20, "metastore query p99 at 1,000,000 entries, ms"),
    Target("ingest", "ratios.vs_spark_file_sink", ">=", 1.0,
           "ingest against Spark's Kafka-to-Parquet file sink, local disk (issue 17)"),
    Target("ingest", "ratios.vs_spark_s3a_sink", ">=", 1.0,
           "ingest against Spark's file sink to MinIO through S3A (issue 17)"),
    Target("ingest", "ratios.vs_kafka_consumer_perf", ">=", 0.5,
           "ingest against Kafka's ConsumerPerformance (a JVM that only fetches)"),
    Target("ingest", "ratios.vs_raw_consumer", ">=", 0.5, "ingest against a raw consumer"),
    Target("ingest", "ratios.vs_spark_file_sink_same_fetch", ">=", 1.0,
           "ingest against Spark's file sink given Shale's 16 MiB fetch (issue 32)"),
    Target("compaction", "ratios.throughput_vs_raw", ">=", 0.9,
           "compaction against raw pyarrow read-concatenate-write (issue 17)"),
    Target("compaction", "figures.peak_rss_bytes", "<=", 512 * 2**20,
           "compaction worker's peak resident set within the job byte limit (512 MiB), bytes"),
    Target("bucket_index", "ratios.calls", ">=", 50, "bucket index: fewer calls than a bucket scan, times"),
    Target("bucket_index", "ratios.seconds", ">=", 10, "bucket index: faster cold start than a bucket scan, times"),
    Target("cluster", "ratios.cluster_vs_local", ">=", 0.9,
           "Spark standalone cluster (2 one-core workers) against local mode, backup ingest (issue 32)"),
    Target("freshness", "figures.p99_ms_metastore", "<=", 10_000,
           "freshness: produce-to-queryable p99 through the metastore at 20,000 records/s, defaults, ms (issue 32)"),
    Target("freshness", "figures.p99_ms_low_latency", "<=", 5_000,
           "freshness: p99 in the low-latency profile, ms"),
    Target("freshness", "ratios.p99_low_latency_worst_round_vs_target", "<=", 1.0,
           "freshness: low-latency p99 ≤ 3 s in every round (issue 32)"),
    Target("freshness", "ratios.first_batch_vs_steady", "<=", 2.0,
           "cold start: first batch against a steady batch (issue 32)"),
    Target("freshness", "ratios.p99_from_start_vs_target", "<=", 1.0, "cold start: p99 from the start ≤ 10 s"),
    Target("peers", "ratios.throughput_vs_iceberg_kc", ">=", 2.0,
           "peers: throughput to the last commit of 1,000,000 records against the Iceberg Kafka Connect sink "
           "(issue 32)"),
    Target("peers", "ratios.p99_freshness_vs_iceberg_kc_lowest", "<=", 0.5,
           "peers: p99 freshness against the sink at its lowest working commit interval, defaults"),
    Target("peers", "figures.duplicates_shale", "<=", 0, "peers: duplicates after kill -9 mid-run"),
    Target("scale", "ratios.objects_256_vs_8", "<=", 1.25,
           "scale: level-0 objects per hour at 256 partitions against 8 (issue 40)"),
    Target("scale", "ratios.entries_256_vs_8", "<=", 1.25,
           "scale: metastore entries per hour at 256 partitions against 8 (issue 40)"),
    Target("scale", "ratios.objects_vs_iceberg_kc_256", "<=", 1.0,
           "scale: objects per hour at 256 partitions against the Iceberg sink (issue 40)"),
    Target("scale", "ratios.p99_vs_iceberg_kc_256", "<=", 1.0,
           "scale: p99 produce-to-queryable at 256 partitions against the sink, defaults (issue 40)"),
    Target("scale", "ratios.throughput_vs_iceberg_kc_256", ">=", 1.0,
           "scale: a full topic of 1,000,000 records over 256 partitions against the sink (issue 40)"),
    Target("cost", "ratios.objects_vs_forecast_8", "<=", 1.1,
           "cost: level-0 objects an hour at 8 partitions against `shale config cost`, "
           "at most 10 % over (issue 59)"),
    Target("cost", "ratios.objects_vs_forecast_8", ">=", 0.9,
           "cost: level-0 objects an hour at 8 partitions against `shale config cost`, "
           "at most 10 % under (issue 59)"),
    Target("cost", "ratios.ingest_puts_vs_forecast_8", "<=", 1.1,
           "cost: the ingest drivers' PUTs an hour at 8 partitions against `shale config cost`, "
           "at most 10 % over (issue 59)"),
    Target("cost", "ratios.ingest_puts_vs_forecast_8", ">=", 0.9,
           "cost: the ingest drivers' PUTs an hour at 8 partitions against `shale config cost`, "
           "at most 10 % under (issue 59)"),
    Target("cost", "ratios.objects_vs_forecast_256", "<=", 1.1,
           "cost: level-0 objects an hour at 256 partitions against `shale config cost`, "
           "at most 10 % over (issue 59)"),
    Target("cost", "ratios.objects_vs_forecast_256", ">=", 0.9,
           "cost: level-0 objects an hour at 256 partitions against `shale config cost`, "
           "at most 10 % under (issue 59)"),
    Target("cost", "ratios.ingest_puts_vs_forecast_256", "<=", 1.1,
           "cost: the ingest drivers' PUTs an hour at 256 partitions against `shale config cost`, "
           "at most 10 % over (issue 59)"),
    Target("cost", "ratios.ingest_puts_vs_forecast_256", ">=", 0.9,
           "cost: the ingest drivers' PUTs an hour at 256 partitions against `shale config cost`, "
           "at most 10 % under (issue 59)"),
    Target("cost", "ratios.objects_vs_forecast_2048", "<=", 1.1,
           "cost: level-0 objects an hour at 2048 partitions against `shale config cost`, "
           "at most 10 % over (issue 59)"),
    Target("cost", "ratios.objects_vs_forecast_2048", ">=", 0.9,
           "cost: level-0 objects an hour at 2048 partitions against `shale config cost`, "
           "at most 10 % under (issue 59)"),
    Target("cost", "ratios.ingest_puts_vs_forecast_2048", "<=", 1.1,
           "cost: the ingest drivers' PUTs an hour at 2048 partitions against `shale config cost`, "
           "at most 10 % over (issue 59)"),
    Target("cost", "ratios.ingest_puts_vs_forecast_2048", ">=", 0.9,
           "cost: the ingest drivers' PUTs an hour at 2048 partitions against `shale config cost`, "
           "at most 10 % under (issue 59)"),
    Target("metadata_scale", "ratios.apply_per_partition_10000_vs_100", "<=", 1.5,
           "metadata: one ingest commit's apply time per partition at 10,000 partitions against 100 (issue 55)"),
    Target("metadata_scale", "figures.raft_entry_bytes_per_partition_varied_10000", "<=", 32,
           "metadata: Raft entry bytes per partition of one ingest commit at 10,000 partitions whose offsets and "
           "times differ as a real topic's (issue 55)"),
    Target("metadata_scale", "figures.meta_bytes_per_partition_varied_10000", "<=", 32,
           "metadata: meta.json bytes per partition of a block of 10,000 partitions whose offsets and times differ "
           "as a real topic's (issue 55)"),
    Target("metadata_scale", "ratios.index_bytes_per_block_10000_vs_100", "<=", 1.25,
           "metadata: bucket-index bytes per block at 10,000 partitions against 100 (issue 55)"),
    Target("metadata_scale", "ratios.add_blocks_1m_vs_10k", "<=", 1.25,
           "metadata: a one-block `AddBlocks` into a tenant of 1,000,000 blocks against 10,000 (issue 55)"),
    Target("metadata_scale", "ratios.query_plan_1m_vs_10k", "<=", 2,
           "metadata: query planning (one hour, two matchers) at 1,000,000 blocks per tenant against 10,000 "
           "(issue 55)"),
    Target("efficiency", "figures.mb_per_s_per_core_json_1k", ">=", 40,
           "efficiency: JSON records of ~1 KB, Kafka to committed blocks in both groups, MB/s per busy core of "
           "Shale's processes (issue 56; Redpanda Connect's Iceberg output: 38.3 MB/s per vCPU)"),
    Target("efficiency", "figures.mb_per_s_per_core_avro_1k", ">=", 40,
           "efficiency: Avro records of ~1 KB, MB/s per busy core (issue 56)"),
    Target("efficiency", "figures.mb_per_s_per_core_protobuf_1k", ">=", 20,
           "efficiency: Protobuf records of ~1 KB, MB/s per busy core (issue 56)"),
    Target("efficiency", "figures.records_per_s_per_core_json_130", ">=", 200_000,
           "efficiency: JSON records of ~130 bytes, records/s per busy core (issue 56)"),
    Target("change_tables", "figures.p99_ms_latest_shale_read", "<=", 10_000,
           "change tables: p99 from an upsert produced to its key's latest row readable through `shale.read`, 20,000 "
           "changes/s over 1,000,000 keys, 10 % deletes, defaults, ms (issue 57)"),
    Target("change_tables", "figures.p99_ms_latest_iceberg", "<=", 30_000,
           "change tables: the same through the topic's Iceberg table of latest rows, ms (issue 57)"),
    Target("change_tables", "ratios.vs_spark_merge_into", ">=", 2.0,
           "change tables: a replay of 10,000,000 changes against Spark Structured Streaming's `foreachBatch` + "
           "`MERGE INTO` an Iceberg table (issue 57)"),
    Target("restore", "ratios.vs_producer_perf", ">=", 0.5,
           "restore against Kafka's ProducerPerformance, same records and broker (issue 28)"),
    Target("typed_ingest", "ratios.vs_spark_from_avro", ">=", 1.0,
           "typed ingest of Avro records against Spark's `from_avro` writing Parquet (issue 31)"),
]


def targets_of(bench: str) -> list[Target]:
    return [t for t in TARGETS if t.bench == bench]


def evaluated(bench: str, result: dict[str, Any]) -> list[dict[str, Any]]:
    """A benchmark's targets as its result carries them."""
    out = []
    for t in targets_of(bench):
        value = t.measured(result)
        out.append({"key": t.key, "op": t.op, "value": t.value, "what": t.what, "measured": value,
                    "met": None if value is None else t.met(value)})
    return out


def _number(value: float) -> str:
    return f"{value:,.0f}" if value == int(value) and abs(value) >= 100 else f"{value:,.4g}"


def table(results: Path = RESULTS) -> str:
    """The targets table from the committed results."""
    rows = ["| target | result | met | run |", "| --- | --- | --- | --- |"]
    for t in TARGETS:
        path = results / f"{t.bench}.json"
        result = json.loads(path.read_text()) if path.exists() else {}
        value = t.measured(result)
        goal = f"`{t.bench}` `{t.key}` {t.op} {_number(t.value)}"
        if value is None:
            rows.append(f"| {t.what}: {goal} | not measured | - | - |")
        else:
            rows.append(f"| {t.what}: {goal} | {_number(value)} | {'yes' if t.met(value) else 'no'} | "
                        f"{result.get('date', '?')[:10]}, {result.get('machine', '?').rsplit(', ', 1)[-1]} |")
    return "\n".join(rows)


def rewrite(doc: Path = DOC) -> str:
    """docs/BENCHMARKS.md with its targets table generated again."""
    text = doc.read_text()
    pattern = re.compile(re.escape(MARKERS[0]) + ".*?" + re.escape(MARKERS[1]), re.S)
    if not pattern.search(text):
        raise ValueError(f"{doc} has no {MARKERS[0]} ... {MARKERS[1]} section")
    return pattern.sub(lambda _: f"{MARKERS[0]}\n{table()}\n{MARKERS[1]}", text)
