"""`shale config check` (and the partition group's ingest at start) checks each typed rule against its topic's
registry subject: a time field or label field the schema does not have, or of a type that does not fit, fails
the check naming the subject, the version and the schema id, before a record is quarantined for it. The registry
is a real HTTP server on loopback answering as Apicurio's Confluent-compatible API does."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from shale.cli import cli
from shale.config import load_config
from shale.errors import ConfigError
from shale.ingest.job import IngestJob

V1: dict[str, Any] = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"}, {"name": "status", "type": {"type": "enum", "name": "S", "symbols": ["A", "B"]}},
    {"name": "count", "type": "int"}]}
AT = {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}}
V2: dict[str, Any] = {**V1, "fields": [*V1["fields"],
                                       {"name": "meta", "type": {"type": "record", "name": "Meta", "fields": [AT]}}]}
PROTO = """syntax = "proto3";
package ship;
import "google/protobuf/timestamp.proto";
message Address { string city = 1; }
message Shipment { int64 id = 1; google.protobuf.Timestamp shipped = 2; string carrier = 3; }
"""
TELEMETRY = 'syntax = "proto3";\npackage tele;\nmessage Reading { string device = 1; int32 %s = 4; }\n'
READING: dict[str, Any] = {"type": "record", "name": "Reading", "namespace": "tele", "fields": [
    {"name": "device", "type": "string"}, {"name": "temp_c", "type": "int"}]}
RENAMED: dict[str, Any] = {**READING, "fields": [{"name": "device", "type": "string"},
                                                 {"name": "temp_dc", "type": "int", "aliases": ["temp_c"]}]}
IDS = {**{("readings-value", v): 5400 + v for v in (1, 2, 3)},
       ("orders-value", 1): 5101, ("orders-value", 2): 5102, ("shipments-value", 1): 5201,
       **{("telemetry-value", v): 5300 + v for v in (1, 2, 3)}}
SUBJECTS: dict[str, dict[int, tuple[str, str]]] = {
    "orders-value": {1: ("AVRO", json.dumps(V1)), 2: ("AVRO", json.dumps(V2))},
    "shipments-value": {1: ("PROTOBUF", PROTO)},
    "readings-value": {1: ("AVRO", json.dumps(READING)), 2: ("AVRO", json.dumps(READING)),
                       3: ("AVRO", json.dumps(RENAMED))},
    "telemetry-value": {1: ("PROTOBUF", TELEMETRY % "temp_c"), 2: ("PROTOBUF", TELEMETRY % "temp_c"),
                        3: ("PROTOBUF", TELEMETRY % "temp_dc")}}


class _Registry(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        parts = self.path.split("/")  # /apis/ccompat/v7/subjects/{subject}/versions[/{version}]
        status, body = 404, {"message": "No content", "error_code": 40403}
        if len(parts) >= 7 and parts[4] == "subjects" and parts[6] == "versions":
            versions = SUBJECTS.get(parts[5])
            if versions is None:
                body = {"message": f"No artifact with ID '{parts[5]}' was found.", "error_code": 40401}
            elif len(parts) == 7:
                status, body = 200, sorted(versions)  # type: ignore[assignment]
            elif int(parts[7]) in versions:
                version = int(parts[7])
                kind, text = versions[version]
                status, body = 200, {"subject": parts[5], "version": version, "id": IDS[(parts[5], version)],
                                     "schema": text, "schemaType": kind, "references": []}
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def registry_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Registry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/apis/ccompat/v7"
    server.shutdown()
    server.server_close()


def _config(tmp_path: Path, url: str, options: dict[str, Any], topics: tuple[str, ...] = ("orders",),
            parser: str = "avro") -> Path:
    file = tmp_path / "shale.toml"
    pairs = [f"{key} = {json.dumps(value)}" for key, value in options.items()]
    file.write_text(
        f'[bucket]\nurl = "memory://rules"\n[metastore]\ndata_dir = "{tmp_path}"\n'
        f"[ingest]\ntopics = {json.dumps(list(topics))}\n"
        f'[ingest.schema_registry]\nurl = "{url}"\n'
        f'[[ingest.parsers]]\nparser = "{parser}"\noptions = {{{", ".join(pairs)}}}\n')
    return file


def _check(file: Path) -> Any:
    return CliRunner().invoke(cli, ["--config", str(file), "config", "check"])


def test_a_misspelled_avro_time_field_fails_config_check_naming_the_subject_and_version(
        tmp_path: Path, registry_url: str) -> None:
    """Issue 45: a misspelled time_field passed `shale config check` and quarantined 100 of 100 records."""
    result = _check(_config(tmp_path, registry_url, {"time_field": "meta.att"}))
    assert result.exit_code == 1, result.output
    assert "configuration is valid" not in result.output
    assert ("topic 'orders', subject 'orders-value' version 2 (schema id 5102): time_field 'meta.att' is not a field "
            "of it (its fields: count, id, meta, status)") in result.output
    assert "version 1" in result.output  # the older version lacks it too: a note, printed before the error


def test_a_label_field_that_is_missing_or_not_a_string_fails_config_check(tmp_path: Path, registry_url: str) -> None:
    result = _check(_config(tmp_path, registry_url, {"label_fields": ["count", "stauts"]}))
    assert result.exit_code == 1, result.output
    assert "version 2 (schema id 5102): label field 'count' is int32, not a string or an enum" in result.output
    assert "version 2 (schema id 5102): label field 'stauts' is not a field of it" in result.output


def test_a_time_field_of_the_wrong_type_fails_config_check(tmp_path: Path, registry_url: str) -> None:
    result = _check(_config(tmp_path, registry_url, {"time_field": "status"}))
    assert result.exit_code == 1, result.output
    assert "time_field 'status' is string, not a timestamp or an integer of epoch milliseconds" in result.output


def test_a_rule_that_fits_the_newest_version_passes_with_a_note_on_an_older_one(
        tmp_path: Path, registry_url: str) -> None:
    result = _check(_config(tmp_path, registry_url, {"time_field": "meta.at", "label_fields": ["status"]},
                            topics=("orders", "refunds")))
    assert result.exit_code == 0, result.output
    assert result.output.rstrip().endswith("configuration is valid")
    assert "note: topic 'orders', subject 'orders-value' version 1 (schema id 5101): time_field 'meta.at'" in (
        result.output)
    assert "note: topic 'refunds': subject 'refunds-value' is not in the schema registry yet" in result.output


def test_a_registry_that_does_not_answer_usefully_fails_config_check_naming_the_url(tmp_path: Path,
                                                                                    registry_url: str) -> None:
    wrong = registry_url.removesuffix("/apis/ccompat/v7")
    result = _check(_config(tmp_path, wrong, {"time_field": "meta.at"}))
    assert result.exit_code == 1, result.output
    assert f"could not be checked against the schema registry: schema registry {wrong} answered HTTP 404" in (
        result.output)
    assert "ingest.schema_registry.url" in result.output


def test_the_partition_group_refuses_to_start_with_a_rule_that_does_not_fit(tmp_path: Path,
                                                                            registry_url: str) -> None:
    config = load_config(_config(tmp_path, registry_url, {"time_field": "meta.att"}), env={})
    job = IngestJob(config, "partition")
    with pytest.raises(ConfigError, match=r"subject 'orders-value' version 2 \(schema id 5102\): time_field"):
        job.run(available_now=True)  # before any Kafka or Spark: nothing is read, nothing quarantined


def test_a_protobuf_rule_fits_when_one_of_the_files_messages_has_its_fields(tmp_path: Path, registry_url: str) -> None:
    """The records may be of any top-level message (here the second, as in the typed tables' integration test,
    whose file declares Address before Shipment): checking the first one only would refuse a rule that fits."""
    fits = _check(_config(tmp_path, registry_url, {"time_field": "shipped", "label_fields": ["carrier"]},
                          topics=("shipments",), parser="protobuf"))
    assert fits.exit_code == 0, fits.output
    wrong = _check(_config(tmp_path, registry_url, {"time_field": "shiped"}, topics=("shipments",),
                           parser="protobuf"))
    assert wrong.exit_code == 1, wrong.output
    assert "(schema id 5201): message Address: time_field 'shiped' is not a field of it (its fields: city)" in (
        wrong.output)
    assert "message Shipment: time_field 'shiped' is not a field of it (its fields: carrier, id, shipped)" in (
        wrong.output)


def test_a_protobuf_field_renamed_between_versions_is_a_note_naming_the_subject_and_versions(
        tmp_path: Path, registry_url: str) -> None:
    """Issue 59: version 3 renamed `int32 temp_c = 4` to `temp_dc`; each record now fills its writer's column, and
    the check (and the ingest's start, as a warning) says so, with no time field or label to check."""
    result = _check(_config(tmp_path, registry_url, {}, topics=("telemetry",), parser="protobuf"))
    assert result.exit_code == 0, result.output
    assert ("note: topic 'telemetry', subject 'telemetry-value': message tele.Reading field number 4 is 'temp_c' in "
            "version 2 (schema id 5302) and 'temp_dc' from version 3 (schema id 5303): a rename") in result.output
    assert result.output.count("a rename") == 1  # versions 1 and 2 agree


def test_an_avro_field_renamed_with_aliases_is_a_note_naming_the_subject_and_versions(
        tmp_path: Path, registry_url: str) -> None:
    """Issue 59 in Avro: version 3 renamed temp_c to temp_dc with `aliases`; each record fills its writer's column,
    and the check (and the ingest's start, as a warning) says so, with no time field or label to check."""
    result = _check(_config(tmp_path, registry_url, {}, topics=("readings",)))
    assert result.exit_code == 0, result.output
    assert ("note: topic 'readings', subject 'readings-value': record tele.Reading field 'temp_c' of version 2 "
            "(schema id 5402) is 'temp_dc' (aliases 'temp_c') from version 3 (schema id 5403): a rename") in (
        result.output)
    assert result.output.count("a rename") == 1  # versions 1 and 2 agree
