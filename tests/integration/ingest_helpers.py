"""Helpers of the ingest integration tests: topics with realistic records, configs, and ingest processes."""

from __future__ import annotations

import json
import os
import random
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic
from tests.producing import CheckedProducer
from tests.waiting import eventually

from shale.config import BucketConfig, ShaleConfig, load_config
from shale.dev import connector_conf
from shale.failpoints import paused
from shale.process import ManagedProcess

ROOT = Path(__file__).resolve().parents[2]
JSON_PARSER = {"parser": "json", "options": {"time_field": "ts", "time_format": "epoch_s",
                                             "label_fields": ["level"], "fields": ["msg"]}}


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(timeout=30)


def produce_json(bootstrap: str, topic: str, count: int, invalid_every: int = 0, start: int = 0,
                 seed: int = 1) -> Counter[str]:
    """``count`` JSON records (every ``invalid_every``-th one is not JSON). Returns counts of valid/invalid."""
    rng = random.Random(seed)
    producer = CheckedProducer({"bootstrap.servers": bootstrap, "linger.ms": 20, "enable.idempotence": True})
    counts: Counter[str] = Counter()
    base = 1_795_000_000
    for i in range(start, start + count):
        if invalid_every and i % invalid_every == invalid_every - 1:
            value = f"not json {i}".encode()
            counts["invalid"] += 1
        else:
            value = json.dumps({"ts": base + i, "level": rng.choice(["INFO", "WARN", "ERROR"]),
                                "msg": f"event {i}"}).encode()
            counts["valid"] += 1
        producer.produce(topic, key=str(rng.random()).encode(), value=value)
    producer.flush(120)
    return counts


def write_config(path: Path, bootstrap: str, bucket: BucketConfig, topics: list[str],
                 metastore: dict[str, Any] | None = None, parsers_override: list[dict[str, Any]] | None = None,
                 kafka: dict[str, Any] | None = None, spark: dict[str, Any] | None = None, **ingest: Any) -> Path:
    """A TOML config for one test: MinIO bucket, embedded metastore (unless ``metastore`` says otherwise), and
    Spark in local mode with the cached connector jars (``spark`` adds a master and settings)."""
    data = {
        "bucket": {**bucket.model_dump(mode="json"), "secret_access_key": bucket.secret_access_key.get_secret_value()},
        "kafka": kafka or {"bootstrap_servers": bootstrap},
        "metastore": metastore or {"data_dir": str(path / "metastore")},
        "spark": {"master": (spark or {}).get("master", "local[2]"),
                  "conf": {**connector_conf(), **(spark or {}).get("conf", {})}},
        "ingest": {"topics": topics, "trigger_interval": "1s", "backup_trigger_interval": "1s",
                   "parsers": parsers_override or [JSON_PARSER], **ingest},
    }
    lines: list[str] = []
    tables: list[str] = ["[bucket.retry]", "attempts = 5"]
    for section, values in data.items():
        lines.append(f"[{section}]")
        for key, value in values.items():
            if key == "retry":
                continue
            if isinstance(value, list) and value and isinstance(value[0], dict):  # [[section.key]] tables
                for row in value:
                    tables.append(f"[[{section}.{key}]]")
                    tables += [f"{k} = {toml_value(v)}" for k, v in row.items()]
                continue
            lines.append(f"{key} = {toml_value(value)}")
    lines += tables
    file = path / "shale.toml"
    file.write_text("\n".join(lines) + "\n")
    file.chmod(0o600)  # it may hold a Kafka password
    return file


def toml_value(value: Any) -> str:
    """A TOML value: JSON's spelling for scalars and arrays, inline tables for dicts (their None values left out:
    TOML has no null)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()
                               if v is not None) + "}"  # "a.b" quoted
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(value)


def config_of(file: Path) -> ShaleConfig:
    return load_config(file, env={})


def ingest_process(file: Path, group: str, log: Path, *, available_now: bool = False,
                   failpoints: str = "", failpoint_dir: Path | None = None, shard: int | None = None) -> ManagedProcess:
    env = dict(os.environ)
    env.pop("SHALE_FAILPOINTS", None)
    if failpoints:
        env.update(SHALE_FAILPOINTS=failpoints, SHALE_FAILPOINT_DIR=str(failpoint_dir))
    command = [sys.executable, "-m", "shale.cli", "--config", str(file), "ingest", "--group", group]
    if available_now:
        command.append("--available-now")
    if shard is not None:
        command += ["--shard", str(shard)]
    process = ManagedProcess(f"ingest-{group}" + (f"-s{shard}" if shard is not None else ""), command, log, env=env,
                             cwd=ROOT)
    process.start()
    return process


def wait_paused(process: ManagedProcess, directory: Path, name: str, timeout: float = 240) -> None:
    def reached() -> bool:
        if paused(directory, name):
            return True
        assert process.alive(), (f"{process.name} exited before failpoint {name}:\n"
                                   f"{process.log_path.read_text()[-3000:]}")
        return False

    eventually(reached, timeout, f"{process.name} to reach failpoint {name}")


def finish(process: ManagedProcess, timeout: float = 300) -> None:
    """Wait for an --available-now ingest to exit successfully."""
    assert process.popen is not None
    code = process.popen.wait(timeout=timeout)
    assert code == 0, f"{process.name} failed ({code}):\n{process.log_path.read_text()[-4000:]}"


def publish_to_iceberg(file: Path, spark: Any, catalog_name: str) -> None:
    """Turn Iceberg on in a test's config (a SQLite catalog beside it, under a catalog name of the test's own: Spark
    keeps a catalog once it is loaded), publish with `shale iceberg sync`, and point ``spark`` at the catalog."""
    from click.testing import CliRunner

    from shale.cli import cli
    from shale.iceberg import spark_catalog_conf

    with file.open("a") as toml:
        toml.write(f'[iceberg]\nenabled = true\ncatalog_name = "{catalog_name}"\n'
                   f'catalog_uri = "sqlite:///{file.parent}/catalog-{catalog_name}.db"\n')
    out = CliRunner().invoke(cli, ["--config", str(file), "iceberg", "sync"])
    assert out.exit_code == 0, out.output
    for key, value in spark_catalog_conf(config_of(file)).items():
        spark.conf.set(key, value)
