"""A Protobuf field renamed between versions: the column a record's value lands in is its writer's field name,
whatever other versions its chunk holds (docs/design/schemas.md, "Protobuf versions").

The property draws up to three versions of a flat message (fields kept, renamed, removed, retyped within their
wire encoding, added), records of each, and a split of the records into chunks; every record stored both when the
records form one chunk and when they are split holds the same values in the same columns."""

from __future__ import annotations

import base64
import itertools
import json
import logging
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from click.testing import CliRunner
from google.protobuf import descriptor_pb2
from hypothesis import example, given, note
from hypothesis import strategies as st
from tests.factories import backup_table
from tests.protobuf_evolution import (
    READ_MS,
    Field,
    build,
    canonical,
    message_class,
    set_values,
    store_chunk,
    values,
)

from shale.block import BlockMeta
from shale.cli import cli
from shale.config import BucketConfig, IngestConfig, ParserRule, SchemaRegistryConfig, load_config
from shale.encoder.chunks import Chunk, GroupSpec, write_chunk
from shale.metastore import AddBlocks, open_metastore
from shale.objstore import open_bucket
from shale.schemas.registry import RegisteredSchema, RegistryClient
from shale.schemas.wire import frame

REGISTRY = SchemaRegistryConfig(url="http://127.0.0.1:1/apis/ccompat/v7", timeout=2.0)
"""Nothing listens there: schemas are remembered in the cache."""
_ids = itertools.count(80_000)
GROUPS = [["int32", "int64", "uint32", "uint64"], ["sint32", "sint64"], ["float", "double"], ["string"]]
"""Types a field may change between, all of whose values compare equal across the change (a bool read as an int, a
string read as bytes or an enum's name are other Python values of the same meaning: not what this property is
about)."""

Versions = tuple[tuple[Field, ...], ...]
Case = tuple[Versions, list[tuple[int, dict[str, Any]]], list[int]]
"""The versions, the records (version index, what its writer set) and where the records are cut into chunks."""


def _register(file: descriptor_pb2.FileDescriptorProto) -> int:
    sid = next(_ids)
    RegistryClient(REGISTRY).remember(RegisteredSchema(sid, "PROTOBUF",
                                                       base64.standard_b64encode(file.SerializeToString()).decode()))
    return sid


@st.composite
def _field(draw: st.DrawFn, number: int) -> Field:
    return Field(number, f"f{number}", draw(st.sampled_from([t for g in GROUPS for t in g])),
                 draw(st.sampled_from(["implicit", "optional"])))


@st.composite
def _evolved(draw: st.DrawFn, fields: tuple[Field, ...]) -> tuple[Field, ...]:
    out = []
    for f in fields:
        change = draw(st.sampled_from(["keep", "rename", "remove", "type"]))
        if change == "rename":
            out.append(replace(f, name=f"g{f.number}" if f.name.startswith("f") else f"f{f.number}"))
        elif change == "type":
            out.append(replace(f, type=draw(st.sampled_from(next(g for g in GROUPS if f.type in g)))))
        elif change == "keep":
            out.append(f)
    top = max(f.number for f in fields)
    return (*out, *[draw(_field(n)) for n in range(top + 1, top + 1 + draw(st.integers(0 if out else 1, 2)))])


@st.composite
def cases(draw: st.DrawFn) -> Case:
    versions = [tuple(draw(_field(n)) for n in range(1, draw(st.integers(1, 4)) + 1))]
    for _ in range(draw(st.integers(1, 2))):
        versions.append(draw(_evolved(versions[-1])))
    writes = [(v, draw(values(versions[v]))) for v in draw(st.lists(st.integers(0, len(versions) - 1), min_size=2,
                                                                     max_size=8))]
    cuts = sorted(draw(st.sets(st.integers(1, len(writes) - 1), max_size=3)))
    return tuple(versions), writes, cuts


def _stored(versions: Versions, writes: list[tuple[int, dict[str, Any]]], cuts: list[int]) -> dict[int, Any]:
    """Each stored record's non-null field columns (canonical values), by its place in ``writes``, the records
    written as one chunk per run between ``cuts``."""
    files = [build(v, "tele") for v in versions]
    ids = [_register(f) for f in files]
    framed = []
    for version, sets in writes:
        message = message_class(files[version])()
        set_values(message, versions[version], sets)
        framed.append(frame(ids[version], b"\x00" + message.SerializeToString()))
    names = {f.name for v in versions for f in v}
    out: dict[int, Any] = {}
    for start, end in itertools.pairwise([0, *cuts, len(writes)]):
        rows, _ = store_chunk(framed[start:end], REGISTRY)
        for offset, row in rows.items():
            out[start + offset] = {k: canonical(v) for k, v in row.items() if k in names and v is not None}
    return out


F1 = Field(1, "f1", "int32", "implicit")
OPTIONAL_F2 = (F1, Field(2, "f2", "int32", "optional"))
TEMPERATURE = (Field(1, "device", "string", "implicit"), Field(4, "temp_c", "int32", "implicit"))
F1_FLOAT_F2 = (Field(1, "f1", "int32", "optional"), Field(2, "f2", "float", "implicit"))
RENAMED = (Field(1, "device", "string", "implicit"), Field(4, "temp_dc", "int32", "implicit"))


@given(cases())
@example(((TEMPERATURE, RENAMED), [(0, {"device": "a", "temp_c": 21}), (0, {"device": "b", "temp_c": 22}),
                                   (1, {"device": "c", "temp_dc": 215})], [1])).via(
    "the issue's rename: temp_c (number 4) became temp_dc; the version 1 record of the second chunk landed in "
    "temp_dc beside the version 2 record, the one of the first chunk in temp_c")
@example(((OPTIONAL_F2, (F1,), (F1, Field(2, "f2", "int32", "implicit"))),
          [(0, {"f1": 0}), (0, {"f1": 0}), (2, {"f1": 0, "f2": 0})], [1])).via(
    "found by this property: an optional f2 its writer left unset was null in a chunk of its own version and 0 in "
    "one typed by a later version where f2 has no presence (the column's unset value, not the writer's)")
@example(((F1_FLOAT_F2, (Field(1, "f1", "int32", "optional"),), (Field(1, "f1", "int32", "optional"),
            Field(2, "f2", "int32", "implicit"), Field(3, "f3", "int32", "optional"))),
          [(0, {"f2": 0.0}), (2, {"f2": 0})], [1])).via(
    "found by this property in CI: a float f2 (implicit) removed and added back as int32; the first version's "
    "unset f2 (0.0 to its writer) was null in the int32 column of the whole chunk, 0.0 in a chunk of its own")
def test_the_column_a_value_lands_in_does_not_depend_on_the_chunks(case: Case) -> None:
    versions, writes, cuts = case
    note(repr(case))
    whole, split = _stored(versions, writes, []), _stored(versions, writes, cuts)
    for place in whole.keys() & split.keys():  # a value one chunk's column type cannot hold is quarantined there
        assert whole[place] == split[place], (place, writes[place])


def test_a_rename_keeps_each_versions_column_and_is_warned_of(caplog: pytest.LogCaptureFixture) -> None:
    files = [build(TEMPERATURE, "tele"), build(RENAMED, "tele")]
    v2, v3 = (_register(f) for f in files)
    old, new = (message_class(f) for f in files)
    records = [frame(v2, b"\x00" + old(device="a", temp_c=21).SerializeToString()),
               frame(v3, b"\x00" + new(device="b", temp_dc=215).SerializeToString())]
    with caplog.at_level(logging.WARNING):
        rows, reasons = store_chunk(records, REGISTRY)
    assert reasons == {}
    assert [(r["device"], r["temp_c"], r["temp_dc"]) for _, r in sorted(rows.items())] == \
        [("a", 21, None), ("b", None, 215)]
    assert f"field 4: 'temp_c' in schema id {v2}; 'temp_dc' in schema id {v3}" in caplog.text


def test_shale_schemas_shows_each_versions_own_fingerprint_and_fields(tmp_path: Path) -> None:
    """Issue 59: `shale schemas` showed one fingerprint for schema ids 1, 2 and 3 (the one their chunk's rows are
    stored under); each version's own is the one a chunk of that version alone is stored under."""
    files = [build(TEMPERATURE, "tele"), build(RENAMED, "tele")]
    v2, v3 = (_register(f) for f in files)
    old, new = (message_class(f) for f in files)
    both = _blocks(tmp_path, [frame(v2, b"\x00" + old(device="a", temp_c=21).SerializeToString()),
                              frame(v3, b"\x00" + new(device="b", temp_dc=215).SerializeToString())])
    alone = _blocks(tmp_path, [frame(v2, b"\x00" + old(device="c", temp_c=22).SerializeToString())])
    [stored] = {d.schema_fingerprint for b in both for d in b.datasets if d.kind == "records"}
    [own_v2] = {d.schema_fingerprint for b in alone for d in b.datasets if d.kind == "records"}
    assert stored != own_v2
    config = tmp_path / "shale.toml"
    config.write_text(f'[bucket]\nurl = "memory://renames"\n[metastore]\ndata_dir = "{tmp_path}/ms"\n'
                      f'[ingest]\ntopics = ["app"]\n[ingest.schema_registry]\nurl = "{REGISTRY.url}"\n'
                      '[[ingest.parsers]]\nparser = "protobuf"\n')
    assert open_metastore(load_config(config, env={})).submit(AddBlocks(blocks=both)).ok
    listed = CliRunner().invoke(cli, ["--config", str(config), "schemas", "--tenant", "default", "--fields",
                                      "--json"])
    assert listed.exit_code == 0, listed.output
    rows = {r["schema_id"]: r for r in map(json.loads, listed.output.splitlines())}
    assert {sid: (r["version_fingerprint"], r["fingerprint"], r["fields"]) for sid, r in rows.items()} == {
        v2: (own_v2, stored, ["device", "temp_c"]), v3: (stored, stored, ["device", "temp_dc"])}
    table = CliRunner().invoke(cli, ["--config", str(config), "schemas", "--tenant", "default", "--fields"])
    assert table.output.splitlines()[0].split()[:7] == ["TOPIC", "RECORD", "SCHEMA", "ID", "FINGERPRINT", "STORED",
                                                        "AS"]
    assert table.output.splitlines()[1].split()[2:5] == [str(v2), own_v2, stored]
    assert table.output.splitlines()[1].split()[-1] == "device,temp_c"


def _blocks(tmp_path: Path, values_: list[bytes]) -> list[BlockMeta]:
    """The blocks ingest writes for a chunk of ``values_`` (topic app, partition 0)."""
    table = backup_table("app", 0, 0, len(values_))
    table = table.set_column(table.schema.get_field_index("value"), "value", pa.array(values_, pa.binary()))
    spec = GroupSpec("partition", 1, BucketConfig(url=f"memory://renames-{uuid.uuid4().hex}"),
                     IngestConfig(parsers=[ParserRule(parser="protobuf")], schema_registry=REGISTRY))
    written = write_chunk(spec, open_bucket(spec.bucket), table, Chunk("app", 0, "", 0, len(values_), READ_MS))
    return list(written.blocks)
