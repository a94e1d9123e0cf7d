"""A transactional producer (one transaction in five aborted) writes while both ingest groups run as real
processes on default settings; each group is killed with SIGKILL twice mid-stream and restarted. Afterwards every
committed record is stored exactly once in each group, no aborted record is stored anywhere, the offsets of
transaction markers and aborted records are committed as skipped, and `shale verify` agrees."""

from __future__ import annotations

import random
import time
import uuid
from pathlib import Path

from tests.integration.ingest_helpers import config_of, finish, ingest_process, write_config
from tests.integration.kafka_world import TransactionalProducer, create_topic, stored
from tests.waiting import eventually

from shale.metastore import open_metastore
from shale.objstore import open_bucket
from shale.process import ManagedProcess
from shale.verify import verify_topic

GROUPS = ("backup", "partition")


def test_transactional_topic_with_aborts_and_two_sigkills(kafka, minio_bucket, tmp_path: Path) -> None:
    topic = f"payments-{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap_servers, topic, 3)
    other = f"plain-{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap_servers, other, 1)
    # Default settings: no option about transactions, gaps or data loss anywhere.
    file = write_config(tmp_path, kafka.bootstrap_servers, minio_bucket, [topic, other])
    config = config_of(file)
    metastore = open_metastore(config)
    producer = TransactionalProducer(kafka.bootstrap_servers, topic, transactions=100, size=40, pause=0.1)
    thread = producer.start()
    rng = random.Random(7)
    for kill in range(2):  # both groups run side by side; each is killed at a random moment, twice
        processes = {group: ingest_process(file, group, tmp_path / f"{group}-{kill}.log") for group in GROUPS}
        for group, process in processes.items():
            before = sum(o.committed_end for o in metastore.offsets(group, 1) if o.topic == topic)

            def committed_more(group: str = group, process: ManagedProcess = process, before: int = before) -> bool:
                assert process.alive(), process.log_path.read_text()[-3000:]
                return sum(o.committed_end for o in metastore.offsets(group, 1) if o.topic == topic) > before

            eventually(committed_more, 240, f"{group} to commit a batch")
            time.sleep(rng.uniform(0.2, 3.0))  # a random moment: mid-batch, mid-upload or mid-commit
            process.kill9()
        assert not producer.done.is_set()  # the producer was still writing at every kill
    producer.stop.set()
    thread.join(timeout=600)
    assert producer.error is None, producer.error
    assert len(producer.aborted) == producer.written // 5 * 40
    assert producer.written >= 100
    finals = [ingest_process(file, group, tmp_path / f"{group}-final.log", available_now=True) for group in GROUPS]
    for process in finals:  # both groups catch up side by side
        finish(process)

    bucket = open_bucket(config.bucket)
    for group in GROUPS:
        records = stored(metastore, bucket, group, topic)
        assert set(records) == producer.committed, group  # every committed record, no aborted one ...
        assert max(records.values()) == 1, group  # ... each exactly once
        report = verify_topic(metastore, bucket, config.kafka, group, 1, topic)
        assert report.ok, report.as_dict()
        assert (report.missing, report.duplicated, report.not_in_kafka) == (0, 0, 0)
        # Every offset up to the end is committed: records, aborted records and transaction markers alike.
        assert all(p.not_yet_ingested == 0 for p in report.partitions), report.as_dict()
        assert sum(p.skipped for p in report.partitions) >= len(producer.aborted) + producer.written
