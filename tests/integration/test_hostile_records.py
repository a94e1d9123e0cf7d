"""Hostile records among good ones on a real broker, MinIO and Spark (issue 26): JSON nested 100,000 deep, a
1 MB label value, msgpack with binary and extension data in its columns, invalid UTF-8, a JSON lone surrogate
and a record near the broker's size limit. Both groups store every record exactly once (verify: 0 missing, 0
duplicated), every good record is parsed, every hostile one is quarantined with its reason, and the group never
stalls (one --available-now run ends)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import msgpack
from tests.integration.ingest_helpers import config_of, write_config
from tests.integration.kafka_world import create_topic, json_value, stored
from tests.integration.test_kafka_realities import _ingest, _produce

from shale.block import read_dataset
from shale.metastore import open_metastore
from shale.objstore import open_bucket
from shale.verify import group_blocks, verify_topic

GROUPS = ("backup", "partition")
TS = 1_795_000_000


def _reasons(metastore, bucket, topic: str) -> dict[int, str]:  # type: ignore[no-untyped-def]
    """Quarantined offset -> reason, of the partition group."""
    out: dict[int, str] = {}
    for meta in group_blocks(metastore, "partition", 1, topic):
        for d in meta.datasets:
            if d.kind == "quarantine":
                table = read_dataset(bucket, meta, d)
                out.update(zip(table.column("offset").to_pylist(), table.column("reason").to_pylist(), strict=True))
    return out


def test_hostile_records_are_quarantined_and_never_stall_a_group(kafka, minio_bucket, spark, tmp_path: Path) -> None:
    run = uuid.uuid4().hex[:6]
    json_topic, msgpack_topic = f"hostile-json-{run}", f"hostile-msgpack-{run}"
    create_topic(kafka.bootstrap_servers, json_topic, 1, **{"max.message.bytes": str(2 * 2**20)})
    create_topic(kafka.bootstrap_servers, msgpack_topic, 1)
    deep = (f'{{"ts": {TS}, "level": "INFO", "msg": ' + "[" * 100_000 + "]" * 100_000 + "}").encode()
    hostile_json = {
        1: deep,
        3: json.dumps({"ts": TS, "level": "x" * 2**20, "msg": "a megabyte label"}).encode(),
        5: b"\xff\xfe{not utf-8 at all",
        7: b'{"ts": %d, "level": "\\ud800", "msg": "lone surrogate"}' % TS,
    }
    values = [hostile_json.get(i, json_value(i)) for i in range(12)]
    values.append(json_value(12, msg="y" * (2 * 2**20 - 4096)))  # near the topic's limit: a good, huge record
    _produce(kafka.bootstrap_servers, json_topic, values, **{"message.max.bytes": str(3 * 2**20)})
    good = {"ts": TS * 1000, "level": "INFO", "msg": "ok"}
    packed = [msgpack.packb(good), msgpack.packb({**good, "level": b"\x00binary"}, use_bin_type=True),
              msgpack.packb({**good, "msg": msgpack.ExtType(3, b"ext")}), msgpack.packb(good)]
    _produce(kafka.bootstrap_servers, msgpack_topic, packed)
    options = {"time_field": "ts", "label_fields": ["level"], "fields": ["msg"]}
    file = write_config(tmp_path, kafka.bootstrap_servers, minio_bucket, [json_topic, msgpack_topic],
                        parsers_override=[
                            {"topic_pattern": "hostile-json-.*", "parser": "json",
                             "options": {**options, "time_format": "epoch_s"}},
                            {"topic_pattern": "hostile-msgpack-.*", "parser": "msgpack",
                             "options": {**options, "time_format": "epoch_ms"}}])
    config = config_of(file)
    metastore = open_metastore(config)
    _ingest(config, spark, metastore)  # one --available-now run per group: it ends, nothing stalls
    bucket = open_bucket(config.bucket)
    for group in GROUPS:
        for topic, count in ((json_topic, len(values)), (msgpack_topic, len(packed))):
            assert stored(metastore, bucket, group, topic) == {(0, o): 1 for o in range(count)}
            report = verify_topic(metastore, bucket, config.kafka, group, 1, topic)
            assert report.ok, report.as_dict()
            assert (report.missing, report.duplicated) == (0, 0)
    reasons = _reasons(metastore, bucket, json_topic)
    assert sorted(reasons) == sorted(hostile_json)
    assert "nested too deeply" in reasons[1]
    assert "over the 2048-byte limit" in reasons[3]
    assert "invalid JSON" in reasons[5]
    assert "not valid Unicode" in reasons[7]
    reasons = _reasons(metastore, bucket, msgpack_topic)
    assert sorted(reasons) == [1, 2]
    assert all("bytes data" in r for r in reasons.values())
