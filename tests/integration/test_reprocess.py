"""Reprocessing repairs a parser bug: ingest with a wrong parser, delete the first records from Kafka, keep live
ingestion going, reprocess the backup group with the right parser into generation 2 (killed with SIGKILL after
its first round and restarted), switch readers to generation 2, and every record of the range — including those
Kafka no longer has — comes back corrected, exactly once."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

from tests.integration.ingest_helpers import config_of, create_topic, wait_paused, write_config
from tests.producing import CheckedProducer
from tests.waiting import eventually

from shale.ingest.job import IngestJob
from shale.kafka import delete_records_before, watermarks
from shale.metastore import SetActiveGeneration, open_metastore
from shale.objstore import open_bucket
from shale.process import ManagedProcess
from shale.query import Query, run_query
from shale.reprocess import locate, trace_block

ROOT = Path(__file__).resolve().parents[2]
DAY = 86_400_000
T0 = 1_795_000_000_000 - 1_795_000_000_000 % DAY
WRONG = {"parser": "json", "options": {"time_field": "t", "time_format": "epoch_ms", "label_fields": ["level"]}}
RIGHT = ["time_field=\"t\"", "time_format=\"epoch_ms\"", "label_fields=[\"severity\"]"]


def _produce(bootstrap: str, topic: str, first: int, count: int, day: int) -> Counter[str]:
    producer = CheckedProducer({"bootstrap.servers": bootstrap, "linger.ms": 10})
    levels: Counter[str] = Counter()
    for i in range(first, first + count):
        severity = ["INFO", "WARN", "ERROR"][i % 3]
        levels[severity] += 1
        value = json.dumps({"t": T0 + day * DAY + (i % 2000) * 40_000, "severity": severity, "n": i})
        producer.produce(topic, value.encode(), partition=i % 2)
    producer.flush(60)
    return levels


def test_reprocess_fixes_a_parser_bug_including_data_kafka_no_longer_has(kafka, minio_bucket, spark,
                                                                          tmp_path: Path) -> None:
    topic = f"billing-{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap_servers, topic, 2)
    levels = _produce(kafka.bootstrap_servers, topic, 0, 6000, day=0)
    file = write_config(tmp_path, kafka.bootstrap_servers, minio_bucket, [topic], max_records_per_batch=1000,
                        parsers_override=[WRONG])
    config = config_of(file)
    metastore = open_metastore(config)
    for group in ("backup", "partition"):
        IngestJob(config, group, spark=spark, metastore=metastore).run(available_now=True)
    wrong = run_query(Query("default", T0, T0 + DAY - 1), metastore, open_bucket(config.bucket)).read_all()
    assert wrong.num_rows == 6000
    assert "severity" not in wrong.column_names  # the bug: the wrong field was read
    ingested_until = int(time.time() * 1000)

    # Kafka forgets the first half; live ingestion of the topic goes on (next day's records).
    marks = watermarks(config.kafka, {topic: [0, 1]})
    for partition in (0, 1):
        delete_records_before(config.kafka, topic, partition, marks[(topic, partition)][1] // 2)
    stop_live = threading.Event()
    live = threading.Thread(target=IngestJob(config, "partition", spark=spark, metastore=metastore).run,
                            kwargs={"stop": stop_live}, daemon=True)
    live.start()
    _produce(kafka.bootstrap_servers, topic, 6000, 1000, day=1)

    # Reprocess in a separate process; kill it after its first committed round; run it again to the end.
    points = tmp_path / "points"
    command = [sys.executable, "-m", "shale.cli", "--config", str(file), "reprocess", "--tenant", "default",
               "--topic", topic, "--from", "0", "--to", str(ingested_until), "--parser", "json",
               "--generation", "2"] + [a for option in RIGHT for a in ("--parser-option", option)]
    env = dict(os.environ, SHALE_FAILPOINTS="reprocess.after-round", SHALE_FAILPOINT_DIR=str(points))
    first = ManagedProcess("reprocess", command, tmp_path / "reprocess-1.log", env=env, cwd=ROOT)
    first.start()
    wait_paused(first, points, "reprocess.after-round")
    first.kill9()
    partial = sum(o.committed_end for o in metastore.offsets("partition", 2))
    assert 0 < partial < 6000
    second = ManagedProcess("reprocess", command, tmp_path / "reprocess-2.log", cwd=ROOT)
    second.start()
    assert second.popen is not None
    assert second.popen.wait(timeout=300) == 0, second.log_path.read_text()[-3000:]
    assert sum(o.committed_end for o in metastore.offsets("partition", 2)) == 6000

    switched = metastore.submit(SetActiveGeneration(tenant="default", topic=topic, generation=2, start=T0,
                                                    end=T0 + DAY - 1))
    assert switched.ok
    eventually(lambda: sum(o.committed_end for o in metastore.offsets("partition", 1)) >= 7000, 120,
               "live ingestion to keep up")
    stop_live.set()
    live.join(timeout=120)

    bucket = open_bucket(config.bucket)
    fixed = run_query(Query("default", T0, T0 + DAY - 1), metastore, bucket).read_all()
    assert fixed.num_rows == 6000
    offsets = Counter(zip(fixed.column("partition").to_pylist(), fixed.column("offset").to_pylist(), strict=True))
    assert max(offsets.values()) == 1
    assert Counter(fixed.column("severity").to_pylist()) == levels
    errors = run_query(Query("default", T0, T0 + DAY - 1, '{severity="ERROR"}'), metastore, bucket).read_all()
    assert errors.num_rows == levels["ERROR"]
    next_day = run_query(Query("default", T0 + DAY, T0 + 2 * DAY), metastore, bucket).read_all()
    assert next_day.num_rows == 1000  # outside the switched range, the live generation is read

    # Traceability: the record at offset 0 (gone from Kafka) is in the backup and in both generations.
    found = locate(metastore, bucket, topic, 0, 0)
    assert {(f.group, f.generation) for f in found} == {("backup", 1), ("partition", 1), ("partition", 2)}
    reprocessed = next(f for f in found if f.generation == 2)
    backup = next(f for f in found if f.group == "backup")
    assert backup.block in trace_block(metastore, reprocessed.block)["backup_blocks"]
