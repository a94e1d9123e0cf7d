"""The chunk path's decoding, one process, no Spark, no Kafka: ``write_chunk`` of a pyarrow table of Kafka records
into the partition group's blocks (an in-memory bucket), per busy core (the process's CPU seconds). JSON values of
about 130 bytes and 1 KB built from the loghub samples (/work/shared/data/loghub or tests/fixtures), Avro and
Protobuf values of about 1 KB; each measured through its parser's batch path and, in the same run, through its
per-record path (the baseline: the path before issue 56). How the time divides between parsing (``parse_records``)
and writing the blocks is measured apart."""

from __future__ import annotations

import base64
import io
import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from bench.common import ROOT, progress, write_result
from shale.block import BACKUP_SCHEMA
from shale.config import BucketConfig, IngestConfig, ParserRule, SchemaRegistryConfig
from shale.encoder.chunks import Chunk, GroupSpec, write_chunk
from shale.encoder.parsers import Parser
from shale.encoder.parsing import parse_records
from shale.objstore import open_bucket
from shale.schemas.registry import RegisteredSchema, RegistryClient
from shale.schemas.wire import frame

RECORDS = 20_000
LOGHUB = [Path("/work/shared/data/loghub"), ROOT / "tests" / "fixtures" / "loghub"]
BASE_MS = 1_795_000_000_000
REGISTRY = SchemaRegistryConfig(url="http://127.0.0.1:1/apis/ccompat/v7", timeout=2.0)
"""Nothing listens there: the writer schemas are remembered in the registry client's cache."""
JSON_OPTIONS = {"time_field": "ts", "time_format": "iso8601", "label_fields": ["level", "host"],
                "fields": ["component", "msg", "pid", "ok"], "types": {"pid": "long", "ok": "boolean"}}
AVRO_SCHEMA = {"type": "record", "name": "Log", "namespace": "bench", "fields": [
    {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "level", "type": "string"}, {"name": "host", "type": "string"}, {"name": "component", "type": "string"},
    {"name": "pid", "type": "long"}, {"name": "ok", "type": "boolean"}, {"name": "msg", "type": "string"}]}


def _lines() -> list[str]:
    folder = next(p for p in LOGHUB if p.is_dir())
    return [line for f in sorted(folder.glob("*.log")) for line in f.read_text(errors="replace").splitlines() if line]


def _fields(i: int, lines: list[str], size: int) -> dict[str, Any]:
    """A log event of about ``size`` bytes of JSON, its message from consecutive loghub lines."""
    msg = lines[i % len(lines)]
    k = i
    while len(msg) < size - 120:
        k += 1
        msg += " " + lines[k % len(lines)]
    return {"ts": BASE_MS + i, "level": ("INFO", "WARN", "ERROR")[i % 3], "host": f"host{i % 16}",
            "component": "spark.SecurityManager", "pid": 1000 + i % 300, "ok": i % 2 == 0,
            "msg": msg[:max(8, size - 125)]}


def _iso(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"


def json_values(size: int) -> list[bytes]:
    lines = _lines()
    out = []
    for i in range(RECORDS):
        fields = _fields(i, lines, size)
        fields["ts"] = _iso(fields["ts"])
        out.append(json.dumps(fields, separators=(",", ":")).encode())
    return out


def avro_values(size: int) -> list[bytes]:
    sid = 91_001
    RegistryClient(REGISTRY).remember(RegisteredSchema(sid, "AVRO", json.dumps(AVRO_SCHEMA)))
    schema = fastavro.parse_schema(AVRO_SCHEMA)
    lines = _lines()
    out = []
    for i in range(RECORDS):
        body = io.BytesIO()
        fastavro.schemaless_writer(body, schema, _fields(i, lines, size))
        out.append(frame(sid, body.getvalue()))
    return out


def _proto_file() -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(name="log.proto", package="bench", syntax="proto3")
    message = file.message_type.add(name="Log")
    for number, (name, kind) in enumerate([("ts_ms", proto.TYPE_INT64), ("level", proto.TYPE_STRING),
                                           ("host", proto.TYPE_STRING), ("component", proto.TYPE_STRING),
                                           ("pid", proto.TYPE_INT64), ("ok", proto.TYPE_BOOL),
                                           ("msg", proto.TYPE_STRING)], start=1):
        message.field.add(name=name, number=number, type=kind, label=proto.LABEL_OPTIONAL)
    return file


def protobuf_values(size: int) -> list[bytes]:
    sid = 91_002
    file = _proto_file()
    RegistryClient(REGISTRY).remember(RegisteredSchema(
        sid, "PROTOBUF", base64.standard_b64encode(file.SerializeToString()).decode()))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("bench.Log"))
    lines = _lines()
    out = []
    for i in range(RECORDS):
        fields = _fields(i, lines, size)
        fields["ts_ms"] = fields.pop("ts")
        out.append(frame(sid, b"\x00" + cls(**fields).SerializeToString()))
    return out


CASES: dict[str, tuple[Callable[[int], list[bytes]], int, str, dict[str, Any]]] = {
    "json_130": (json_values, 130, "json", JSON_OPTIONS),
    "json_1k": (json_values, 1024, "json", JSON_OPTIONS),
    "avro_1k": (avro_values, 1024, "avro", {"time_field": "ts", "label_fields": ["level", "host"]}),
    "protobuf_1k": (protobuf_values, 1024, "protobuf", {"time_field": "ts_ms", "label_fields": ["level", "host"]}),
}


def _table(values: list[bytes]) -> pa.Table:
    n = len(values)
    return pa.table({
        "topic": ["app"] * n, "partition": pa.array([0] * n, pa.int32()), "offset": pa.array(range(n), pa.int64()),
        "timestamp": pa.array([BASE_MS + i for i in range(n)], pa.timestamp("ms", tz="UTC")),
        "timestamp_type": pa.array([0] * n, pa.int8()), "key": pa.nulls(n, pa.binary()),
        "value": pa.array(values, pa.binary()), "headers": pa.nulls(n, BACKUP_SCHEMA.field("headers").type),
    }, schema=BACKUP_SCHEMA)


def _spec(parser: str, options: dict[str, Any]) -> GroupSpec:
    rule = ParserRule(parser=parser, options=options)
    return GroupSpec("partition", 1, BucketConfig(url=f"memory://bench-decode-{uuid.uuid4().hex}"),
                     IngestConfig(parsers=[rule], schema_registry=REGISTRY))


def _per_record(parser: Parser) -> None:
    """The parser's batch path off: every record through ``parse`` (the path before issue 56)."""
    parser.parse_batch = lambda values: None  # type: ignore[method-assign]


def _measure(spec: GroupSpec, table: pa.Table, rounds: int = 5) -> tuple[float, float]:
    """The least CPU seconds of ``rounds`` runs of write_chunk, and of parse_records alone."""
    chunk = Chunk("app", 0, "", 0, table.num_rows, BASE_MS + 3_600_000)
    parser = spec.parser_for("app")
    whole, parse = [], []
    for _ in range(rounds):
        start = time.process_time()
        write_chunk(spec, open_bucket(spec.bucket), table, chunk)
        whole.append(time.process_time() - start)
        start = time.process_time()
        parsed, _, rejected, _ = parse_records(parser, table, chunk.read_time_ms + 86_400_000, False)
        parse.append(time.process_time() - start)
        assert parsed.num_rows == table.num_rows, rejected[:3]  # every bench record parses
    return min(whole), min(parse)


def run() -> dict[str, Any]:
    figures: dict[str, float] = {}
    baseline: dict[str, float] = {}
    ratios: dict[str, float] = {}
    details: dict[str, Any] = {"records": RECORDS, "cases": {}}
    for case, (make, size, parser_name, options) in CASES.items():
        values = make(size)
        table = _table(values)
        mb = sum(map(len, values)) / 1e6
        batched_spec, single_spec = _spec(parser_name, options), _spec(parser_name, options)
        single = single_spec.parser_for("app")
        assert not isinstance(single, str)
        _per_record(single)
        after, after_parse = _measure(batched_spec, table)
        before, before_parse = _measure(single_spec, table)
        progress(f"{case}: {len(values)} records of {mb * 1e6 / len(values):.0f} bytes: batch {after:.3f} s "
                 f"(parse {after_parse:.3f} s), per record {before:.3f} s (parse {before_parse:.3f} s)")
        figures[f"mb_per_s_per_core_{case}"] = round(mb / after, 2)
        figures[f"records_per_s_per_core_{case}"] = round(len(values) / after)
        baseline[f"mb_per_s_per_core_{case}"] = round(mb / before, 2)
        baseline[f"records_per_s_per_core_{case}"] = round(len(values) / before)
        ratios[f"{case}_vs_per_record"] = round(before / after, 2)
        details["cases"][case] = {
            "value_bytes": round(mb * 1e6 / len(values)), "cpu_seconds": round(after, 4),
            "parse_cpu_seconds": round(after_parse, 4), "per_record_cpu_seconds": round(before, 4),
            "per_record_parse_cpu_seconds": round(before_parse, 4),
            "parse_share": round(after_parse / after, 3)}
    return write_result(
        "decode", figures=figures, baseline=baseline, ratios=ratios, details=details,
        notes=f"The chunk path alone (no Kafka, no Spark): ``write_chunk`` of {RECORDS:,} Kafka records into the "
              "partition group's blocks in an in-memory bucket, one process, CPU seconds (the least of five "
              "runs). JSON log events of about 130 bytes and 1 KB (messages from the loghub samples, an ISO 8601 "
              "time, two labels, a long and a boolean column), Avro and Protobuf of about 1 KB. Figures: the "
              "parsers' batch path (issue 56); baseline: every record through the per-record ``parse``, the path "
              "before it, in the same run. ``cases`` in the JSON result holds the CPU seconds of the parse alone "
              "(``parse_records``) beside the whole chunk's.")


