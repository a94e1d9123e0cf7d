"""Every Spark application of Shale on a real standalone cluster (a master and two one-core workers, each its own
JVM, on loopback) gives what it gives in local mode: both ingest groups, reprocessing, compaction and the
``shale`` data source, run as ``shale`` commands in their own processes from a configuration that sets nothing but
``spark.master``, the connector jars on ``spark.jars`` and a loopback driver. Results are read back from the bucket
alone and compared record by record: the same records, each stored exactly once."""

from __future__ import annotations

import sys
import time
import uuid
from collections import Counter
from pathlib import Path

from tests.integration.cluster_helpers import (
    Record,
    bucket_records,
    healthy_blocks,
    offsets,
    read_with_data_source,
    run_shale,
)
from tests.integration.ingest_helpers import config_of, create_topic, produce_json, write_config

from shale.config import BucketConfig
from shale.dev import MinioServer, SparkStandalone, driver_conf
from shale.metastore import open_metastore
from shale.objstore import open_bucket
from shale.query import Query, run_query

COMPACTION = '\n[compaction]\nblocks_per_job = [4]\nmax_level = 1\npoll_interval = "0.5s"\n'
JSON_OPTIONS = ['time_field="ts"', 'time_format="epoch_s"', 'label_fields=["level"]', 'fields=["msg"]']


def _bucket(minio: MinioServer) -> BucketConfig:
    name = f"t-{uuid.uuid4().hex[:12]}"
    minio.create_bucket(name)
    return BucketConfig(url=f"s3://{name}", endpoint=minio.endpoint, access_key_id=minio.access_key,
                        secret_access_key=minio.secret_key, allow_http=True)


def _pipeline(config: Path, work: Path, topic: str) -> None:
    """Both ingest groups, then a reprocess of ``topic`` into generation 2."""
    for group in ("backup", "partition"):
        run_shale(config, ["ingest", "--group", group, "--available-now"], work / f"ingest-{group}.log")
    options = [a for option in JSON_OPTIONS for a in ("--parser-option", option)]
    run_shale(config, ["reprocess", "--tenant", "default", "--topic", topic, "--from", "0", "--to", "now",
                       "--parser", "json", "--generation", "2", *options], work / "reprocess.log")


def test_every_application_gives_the_same_records_on_the_cluster_as_in_local_mode(
        kafka, minio, spark_cluster: SparkStandalone, tmp_path: Path) -> None:
    run = uuid.uuid4().hex[:6]
    orders, clicks = f"orders-{run}", f"clicks-{run}"
    create_topic(kafka.bootstrap_servers, orders, 4)
    create_topic(kafka.bootstrap_servers, clicks, 2)
    counts = {orders: produce_json(kafka.bootstrap_servers, orders, 6_000, invalid_every=40, seed=1),
              clicks: produce_json(kafka.bootstrap_servers, clicks, 2_000, invalid_every=25, seed=2)}
    valid = sum(c["valid"] for c in counts.values())
    invalid = sum(c["invalid"] for c in counts.values())

    modes = {"cluster": {"master": spark_cluster.master_url, "conf": driver_conf()}, "local": {"master": "local[2]"}}
    configs, buckets = {}, {}
    for mode, spark in modes.items():
        (tmp_path / mode).mkdir()
        buckets[mode] = _bucket(minio)
        configs[mode] = write_config(tmp_path / mode, kafka.bootstrap_servers, buckets[mode], [orders, clicks],
                                     spark=spark, max_records_per_batch=2_500)
        with configs[mode].open("a") as f:
            f.write(COMPACTION)
    cluster_config = config_of(configs["cluster"])
    assert cluster_config.spark.master.startswith("spark://")

    before: dict[str, dict[str, Counter[Record]]] = {}
    for mode in modes:
        _pipeline(configs[mode], tmp_path / mode, orders)
        before[mode] = {name: bucket_records(buckets[mode], group, generation, kind) for name, group, generation, kind
                        in (("backup", "backup", 1, "records"), ("parsed", "partition", 1, "records"),
                            ("quarantine", "partition", 1, "quarantine"), ("reprocessed", "partition", 2, "records"))}
    for name, expected in (("backup", valid + invalid), ("parsed", valid), ("quarantine", invalid),
                           ("reprocessed", counts[orders]["valid"])):
        assert before["cluster"][name] == before["local"][name], name  # the same records, field by field
        stored = offsets(before["cluster"][name])
        assert sum(stored.values()) == len(stored) == expected, name  # each exactly once

    for mode in modes:
        run_shale(configs[mode], ["compact", "--until-idle"], tmp_path / mode / "compact.log")
        for name, group, generation, kind in (("backup", "backup", 1, "records"), ("parsed", "partition", 1,
                                                                                   "records"),
                                              ("quarantine", "partition", 1, "quarantine")):
            assert bucket_records(buckets[mode], group, generation, kind) == before[mode][name], (mode, name)
    for topic in (orders, clicks):  # the cluster's buckets hold what local mode's do: verify one of them
        for group in ("backup", "partition"):
            run_shale(configs["cluster"], ["verify", "--group", group, "--topic", topic],
                      tmp_path / "cluster" / f"verify-{group}-{topic}.log",
                      codes=(0, 4) if group == "partition" else (0,))  # 4: complete, invalid records quarantined
    levels = {mode: Counter((m.group, m.level) for m in healthy_blocks(buckets[mode])) for mode in modes}
    assert levels["cluster"] == levels["local"]
    assert sum(n for (_, level), n in levels["cluster"].items() if level == 1) >= 4  # compaction did run

    # The data source on the cluster returns what the Python API returns from the local-mode bucket.
    selector = f'{{topic="{orders}", level="ERROR"}}'
    read = read_with_data_source(configs["cluster"], "default", selector, tmp_path / "read")
    assert read["master"] == spark_cluster.master_url
    assert read["executors"] == 2  # two executor JVMs, one per worker
    assert {python for python, _ in read["python_workers"]} == {sys.executable}
    assert {host for _, host in read["python_workers"]} <= {"127.0.0.2", "127.0.0.3"}
    local = config_of(configs["local"])
    expected = run_query(Query("default", 0, int(time.time() * 1000), selector), open_metastore(local),
                         open_bucket(local.bucket)).read_all()
    keys = ("topic", "partition", "offset", "level", "msg")
    assert Counter(tuple(r) for r in read["rows"]) == Counter(zip(*(expected.column(k).to_pylist() for k in keys),
                                                                  strict=True))
    assert 0 < len(read["rows"]) < counts[orders]["valid"]
