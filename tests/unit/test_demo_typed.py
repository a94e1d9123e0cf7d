"""The demo's Avro topic (``shale.demo.typed``): every Zookeeper line of the sample becomes a record of its version's
schema, the decimal is the line's exact length in kilobytes, and the second version reads the first's records
(a field added with a default), as the registry's BACKWARD rule and the avro parser's resolution need."""

from __future__ import annotations

import io
from collections import Counter

import fastavro

from shale.demo import loghub_lines
from shale.demo.typed import SAMPLE, V1, V2, events
from shale.schemas.avro import Decoder


def test_every_line_is_a_record_of_its_version_and_v2_reads_v1() -> None:
    lines = loghub_lines(SAMPLE)
    records = list(events(lines))
    assert Counter(version for version, _ in records) == {1: len(lines) // 2, 2: len(lines) - len(lines) // 2}
    schemas = {1: fastavro.parse_schema(V1), 2: fastavro.parse_schema(V2)}
    newest = Decoder(V2)
    for raw, (version, record) in zip(lines, records, strict=True):
        assert record["size_kb"] * 1000 == len(raw)  # exact
        assert record["level"] in V1["fields"][1]["type"]["symbols"]
        body = io.BytesIO()
        fastavro.schemaless_writer(body, schemas[version], record)  # raises on a record its schema refuses
        if version == 1:
            resolved = Decoder(V1, V2).decode(body.getvalue())
            assert resolved["peer"] == "unknown"
            assert resolved["size_kb"] == record["size_kb"]
        else:
            assert newest.decode(body.getvalue())["peer"] == record["peer"]
