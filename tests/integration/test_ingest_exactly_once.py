"""Exactly-once persistence of 200,000 records, valid and invalid JSON mixed, 2 topics of 4 partitions, into the
backup and partition groups; then new records arrive and a second run resumes from the metastore's committed
offsets (the only record of progress)."""

from __future__ import annotations

import uuid
from pathlib import Path

from tests.integration.ingest_helpers import config_of, create_topic, produce_json, write_config

from shale.ingest.job import IngestJob
from shale.metastore import open_metastore
from shale.objstore import open_bucket
from shale.verify import build_ledger, verify_topic


def _run(config, group: str, spark, metastore) -> None:  # type: ignore[no-untyped-def]
    job = IngestJob(config, group, spark=spark, metastore=metastore)
    job.run(available_now=True)
    assert job.batches >= 1


def test_two_groups_store_every_record_once(kafka, minio_bucket, spark, tmp_path: Path) -> None:
    run = uuid.uuid4().hex[:6]
    topics = [f"orders-{run}", f"clicks-{run}"]
    counts = {}
    for i, topic in enumerate(topics):
        create_topic(kafka.bootstrap_servers, topic, 4)
        counts[topic] = produce_json(kafka.bootstrap_servers, topic, 100_000, invalid_every=40, seed=i)
    file = write_config(tmp_path, kafka.bootstrap_servers, minio_bucket, topics, max_records_per_batch=60_000)
    config = config_of(file)
    metastore = open_metastore(config)
    bucket = open_bucket(config.bucket)
    for group in ("backup", "partition"):
        _run(config, group, spark, metastore)

    for topic in topics:
        for group, quarantined in (("backup", 0), ("partition", counts[topic]["invalid"])):
            report = verify_topic(metastore, bucket, config.kafka, group, 1, topic)
            assert report.missing == 0, report.as_dict()
            assert report.duplicated == 0, report.as_dict()
            assert report.stored == 100_000
            assert report.quarantined == quarantined == (2500 if group == "partition" else 0)
            assert all(p.not_yet_ingested == 0 for p in report.partitions)
    offsets = metastore.offsets("backup", 1)
    assert sum(o.committed_end for o in offsets) == 200_000
    ledger = build_ledger(metastore, "partition", 1, topics[0])
    assert sum(d.rows for d in ledger.days) == counts[topics[0]]["valid"]

    # New records arrive; ingestion resumes from the metastore's committed offsets, without duplicates.
    more = produce_json(kafka.bootstrap_servers, topics[0], 20_000, invalid_every=40, start=100_000, seed=9)
    for group in ("backup", "partition"):
        _run(config, group, spark, metastore)
    for group, quarantined in (("backup", 0), ("partition", counts[topics[0]]["invalid"] + more["invalid"])):
        report = verify_topic(metastore, bucket, config.kafka, group, 1, topics[0])
        assert (report.missing, report.duplicated, report.stored) == (0, 0, 120_000), report.as_dict()
        assert report.quarantined == quarantined
