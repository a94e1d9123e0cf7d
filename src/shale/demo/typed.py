"""The demo's typed topic (issue 31): the Zookeeper sample's lines as Avro records in the Confluent wire format,
written by confluent-kafka's ``AvroSerializer`` through a real Schema Registry (Apicurio), with a decimal, a
timestamp-millis, an enum and a nested record; the schema evolves halfway through the topic (a field added with a
default). The partition group reads it with the ``avro`` parser into typed columns, shown afterwards through
``shale query`` and a Spark SQL query over Shale's Spark data source, then published as an Iceberg table and read
by DuckDB."""

from __future__ import annotations

import decimal
import json
import re
import subprocess
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from shale.config import IcebergConfig, ParserRule, ShaleConfig
from shale.dev import DUCKDB_VERSION
from shale.metastore import MetastoreService
from shale.objstore import Bucket

TOPIC = "typed.zookeeper"
SAMPLE = "Zookeeper"
V1: dict[str, Any] = {"type": "record", "name": "ZookeeperLine", "namespace": "shale.demo", "fields": [
    {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "level", "type": {"type": "enum", "name": "Level", "symbols": ["DEBUG", "INFO", "WARN", "ERROR"]}},
    {"name": "source", "type": {"type": "record", "name": "Source", "fields": [
        {"name": "thread", "type": "string"}, {"name": "logger", "type": "string"}, {"name": "line", "type": "int"}]}},
    {"name": "size_kb", "type": {"type": "bytes", "logicalType": "decimal", "precision": 8, "scale": 3}},
    {"name": "message", "type": "string"},
]}
V2: dict[str, Any] = {**V1, "fields": [*V1["fields"], {"name": "peer", "type": "string", "default": "unknown"}]}
"""The second version: the first IP address the line names ("none" if it names none); v1 records read as v2 get
the default."""
PARSER = ParserRule(topic_pattern=re.escape(TOPIC), parser="avro",
                    options={"time_field": "ts", "label_fields": ["level"]})
_LINE = re.compile(r"(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) - (?P<level>[A-Z]+)\s+"
                   r"\[(?P<thread>.*):(?P<logger>[^:\[\]@]+)@(?P<line>\d+)\] - (?P<message>.*)")
_ADDRESS = re.compile(rb"\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}")


def events(lines: list[bytes]) -> Iterator[tuple[int, dict[str, Any]]]:
    """(schema version, record) per Zookeeper line: the first half in v1, the rest in v2."""
    for n, raw in enumerate(lines):
        match = _LINE.fullmatch(raw.decode())
        if match is None:
            raise ValueError(f"Zookeeper line {n + 1} does not have the expected layout: {raw[:80]!r}")
        record: dict[str, Any] = {
            "ts": datetime.strptime(match["ts"], "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=UTC),
            "level": match["level"],
            "source": {"thread": match["thread"], "logger": match["logger"], "line": int(match["line"])},
            "size_kb": decimal.Decimal(len(raw)).scaleb(-3),  # exact: the line's length in kilobytes
            "message": match["message"]}
        version = 1 if n < len(lines) // 2 else 2
        if version == 2:
            address = _ADDRESS.search(raw)
            record["peer"] = address.group().decode() if address else "none"
        yield version, record


def produce_avro(bootstrap: str, registry_url: str, lines: list[bytes]) -> int:
    """Write the lines to ``TOPIC`` (2 partitions) with AvroSerializer, evolving the schema halfway (the subject's
    compatibility set to BACKWARD before, so the registry checks the change); returns the number of records."""
    import warnings

    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic
    from confluent_kafka.serialization import MessageField, SerializationContext

    with warnings.catch_warnings():
        # The registry client imports authlib's httpx integration, which warns that it will move to httpx2 (a
        # deprecation of authlib's, nothing the demo's reader can act on): the demo's output stays its own.
        warnings.filterwarnings("ignore", message="The httpx module is deprecated")
        from confluent_kafka.schema_registry import SchemaRegistryClient
        from confluent_kafka.schema_registry.avro import AvroSerializer

    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept until the futures resolve
    for future in admin.create_topics([NewTopic(TOPIC, 2, 1)]).values():
        future.result(timeout=30)
    client = SchemaRegistryClient({"url": registry_url})
    serializers = {1: AvroSerializer(client, json.dumps(V1)), 2: AvroSerializer(client, json.dumps(V2))}
    context = SerializationContext(TOPIC, MessageField.VALUE)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 10})
    count = 0
    for n, (version, record) in enumerate(events(lines)):
        if version == 2 and count == len(lines) // 2:  # v1 is registered by now: the evolution must be compatible
            client.set_compatibility(f"{TOPIC}-value", "BACKWARD")
        producer.produce(TOPIC, key=f"{SAMPLE}-{n}".encode(), value=serializers[version](record, context))
        count += 1
    if producer.flush(60):
        raise RuntimeError(f"records for {TOPIC} were not delivered within 60 s")
    return count


def show_typed(say: Callable[[str], None], spark: Any, config_file: Path, shale: Callable[[list[str]], None],
               ) -> list[list[Any]]:
    """The typed table through ``shale query`` (``shale`` runs the command line: the CLI's own ``shale demo`` passes
    it, in this process) and a Spark SQL query over Shale's data source, both finding the blocks through the bucket
    index (the metastore is this process's own). Returns the Spark query's rows: level, lines, kB."""
    from shale.query import register

    selector = f'{{topic="{TOPIC}", level="ERROR"}}'
    args = ["--config", str(config_file), "query", "--tenant", "infra", "--from", "2015-01-01", "--to", "now",
            "--source", "bucket-index", "--columns", "offset,ts,level,source,size_kb", "--limit", "4", selector]
    say(f"shale {' '.join(args[2:-1])} '{selector}':")
    shale(args)
    register(spark)
    frame = (spark.read.format("shale").option("config", str(config_file)).option("tenant", "infra")
             .option("source", "bucket-index").option("selector", f'{{topic="{TOPIC}"}}').load())
    frame.createOrReplaceTempView("zookeeper")
    say("Spark SQL over the same blocks (spark.read.format(\"shale\"), Shale's data source), the typed columns:")
    types = dict(frame.dtypes)
    for name in ("ts", "level", "source", "size_kb", "message", "peer"):
        say(f"  {name}: {types[name]}")
    sql = "SELECT level, count(*) AS lines, sum(size_kb) AS kb FROM zookeeper GROUP BY level ORDER BY level"
    result = spark.sql(sql)
    say(f"  {sql}  -- kb is {dict(result.dtypes)['kb']}")
    spark_rows = [[row.level, row.lines, row.kb] for row in result.collect()]
    for level, lines, kb in spark_rows:
        say(f"    {level}: {lines} lines, sum(size_kb) = {kb} kB")
    # v2 rows carry a peer; v1 rows have none (null): each record fills the columns of its writer's fields
    versions = spark.sql("SELECT count_if(peer IS NOT NULL) AS v2, count_if(peer IS NULL) AS v1 "
                         "FROM zookeeper").collect()[0]
    say(f"  rows written with schema v1: {versions.v1}, with v2 (the added field peer): {versions.v2}")
    return spark_rows


DUCKDB_SQL = ("SELECT level, count(*) AS lines, sum(size_kb) AS kb FROM iceberg_scan('{metadata}') "
              "GROUP BY level ORDER BY level")


def show_duckdb(say: Callable[[str], None], config: ShaleConfig, metastore: MetastoreService, bucket: Bucket,
                catalog_db: Path, spark_rows: list[list[Any]]) -> bool:
    """The typed topic's Iceberg table (published by Shale's publisher into a SQLite catalog beside the demo, the
    metadata in the bucket folder), read by DuckDB 1.5.5's Iceberg extension directly on the table's metadata file
    (its own environment, a subprocess: ``shale.dev.duckdb_iceberg``). True when DuckDB's answer is Spark's."""
    from shale.dev import fetch_duckdb
    from shale.iceberg import IcebergPublisher, identifier

    published = config.model_copy(update={"iceberg": IcebergConfig(
        enabled=True, catalog_uri=f"sqlite:///{catalog_db}")})
    publisher = IcebergPublisher(published, metastore.state.reader, metastore.submit, bucket)
    report = publisher.sync()
    metadata = publisher.catalog.load_table(identifier("infra", TOPIC)).metadata_location
    sql = DUCKDB_SQL.format(metadata=metadata)
    say(f"the Iceberg tables published ({report['snapshots']} snapshots, {report['tables']} tables); DuckDB "
        f"{DUCKDB_VERSION} with its Iceberg extension, on the table's metadata:")
    say(f"  {DUCKDB_SQL.format(metadata='.../' + metadata.rsplit('/', 1)[1])}")
    script = Path(__file__).resolve().parents[1] / "dev" / "duckdb_iceberg.py"
    spec = {"s3": {"endpoint": "", "key_id": "", "secret": "", "region": "us-east-1"}, "queries": {"levels": sql}}
    done = subprocess.run([str(fetch_duckdb()), str(script)], input=json.dumps(spec), capture_output=True,
                          text=True, timeout=300, check=False)
    if done.returncode != 0:
        say(f"  DuckDB failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}")
        return False
    rows = json.loads(done.stdout)["levels"]
    for level, lines, kb in rows:
        say(f"    {level}: {lines} lines, sum(size_kb) = {kb} kB")
    same: bool = rows == [[level, lines, str(kb)] for level, lines, kb in spark_rows]
    say(f"  the same as Spark SQL's answer: {'yes' if same else 'NO'}")
    return same
