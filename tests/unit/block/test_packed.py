"""The packed form of Kafka ranges, tables of contents and offset ranges (``shale.block.packed``): any value
round-trips, in meta.json and in a commit's Raft entry; the list form of the previous release still reads; a
malformed packed value is a clear error."""

from __future__ import annotations

import base64
import json
import random
import zlib
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from tests.factories import BASE_MS

from shale.block import (
    LISTED,
    BlockMeta,
    Compaction,
    Dataset,
    FileInfo,
    KafkaRange,
    deterministic_block_id,
    packed,
    parse_meta,
)
from shale.block.packed import (
    PACK_FROM,
    PACKED_TAG,
    pack_counted_ranges,
    pack_ints,
    pack_ranges,
    pack_row_groups,
    unpack_counted_ranges,
    unpack_ints,
    unpack_ranges,
    unpack_row_groups,
)
from shale.errors import CommandRejectedError, CorruptObjectError
from shale.metastore.rules.commands import CommitIngestBatch, OffsetRange, decode, encode

OLD_FORMS = Path(__file__).parents[2] / "fixtures" / "old_forms"
INT64 = st.integers(-(2**63), 2**63 - 1)
OFFSETS = st.integers(0, 2**62)
TOPICS = st.sampled_from(["orders", "a", "b.c-d_e"])
INCARNATIONS = st.sampled_from(["", "Xw2aZ7kVQ0-3bq_PeR8m1A", "x"])


@st.composite
def kafka_ranges(draw: st.DrawFn) -> KafkaRange:
    start = draw(OFFSETS)
    return KafkaRange(topic=draw(TOPICS), incarnation=draw(INCARNATIONS), partition=draw(st.integers(0, 2**31)),
                      start=start, end=start + draw(st.integers(0, 2**63 - 1 - start)))


@st.composite
def offset_ranges(draw: st.DrawFn) -> OffsetRange:
    r = draw(kafka_ranges())
    return OffsetRange(**r.model_dump(), stored=draw(st.none() | st.integers(0, 2**62)),
                       bytes=draw(st.none() | st.integers(0, 2**62)))


def _block(kafka: list[KafkaRange], groups: list[tuple[int, int, int]], partitions: list[int] | None) -> BlockMeta:
    block_id = deterministic_block_id(BASE_MS, "packed")
    return BlockMeta(id=block_id, tenant="acme", group="backup", min_time=0, max_time=1, kafka=kafka,
                     datasets=[Dataset(name="records/a", kind="records", topic="a", file="f.parquet", rows=1,
                                       bytes=0, min_time=0, max_time=1, row_groups=groups,
                                       row_group_partitions=partitions)],
                     files=[FileInfo(name="f.parquet", size=1, crc32="00000000")],
                     compaction=Compaction(sources=[block_id]))


@given(ranges=st.lists(kafka_ranges(), max_size=40))
@example(ranges=[KafkaRange(topic="a", partition=2**31, start=2**62, end=2**63 - 1),
                 KafkaRange(topic="a", partition=0, start=0, end=0)])
def test_any_kafka_ranges_round_trip(ranges: list[KafkaRange]) -> None:
    assert unpack_ranges(pack_ranges(ranges), KafkaRange) == ranges


@given(ranges=st.lists(offset_ranges(), max_size=40))
def test_any_offset_ranges_round_trip(ranges: list[OffsetRange]) -> None:
    assert unpack_counted_ranges(pack_counted_ranges(ranges), OffsetRange) == ranges


@given(groups=st.lists(st.tuples(st.integers(0, 2**62), INT64, INT64), max_size=40),
       partitions=st.lists(st.integers(0, 2**62), max_size=40))
@example(groups=[(0, -(2**63), 2**63 - 1), (1, 2**63 - 1, -(2**63))], partitions=[2**62, 0])
def test_any_table_of_contents_round_trips(groups: list[tuple[int, int, int]], partitions: list[int]) -> None:
    assert unpack_row_groups(pack_row_groups(groups)) == groups
    assert unpack_ints(pack_ints(partitions)) == partitions


@given(ranges=st.lists(kafka_ranges(), max_size=3 * PACK_FROM),
       groups=st.lists(st.tuples(st.integers(0, 2**40), st.integers(-(2**45), 2**45), st.integers(-(2**45), 2**45)),
                       max_size=3 * PACK_FROM),
       counted=st.lists(offset_ranges(), max_size=3 * PACK_FROM), by_partition=st.booleans())
def test_meta_json_and_the_raft_entry_round_trip_in_either_form(
        ranges: list[KafkaRange], groups: list[tuple[int, int, int]], counted: list[OffsetRange],
        by_partition: bool) -> None:
    block = _block(ranges, groups, list(range(len(groups))) if by_partition and groups else None)
    data = block.to_json()
    assert parse_meta(data, where="test") == block
    raw = json.loads(data)
    assert isinstance(raw["kafka"], str) == (len(ranges) >= PACK_FROM)
    assert isinstance(raw["datasets"][0]["row_groups"], str) == (len(groups) >= PACK_FROM)
    command = CommitIngestBatch(group="backup", ranges=counted, blocks=[block], lease=3)
    assert decode(encode(command)) == command
    assert decode(encode(command, "msgpack")) == command
    assert isinstance(json.loads(encode(command))["ranges"], str) == (len(counted) >= PACK_FROM)


def test_values_past_64_bits_are_written_as_lists() -> None:
    ranges = [KafkaRange(topic="a", partition=p, start=2**70, end=2**70 + p) for p in range(PACK_FROM)]
    block = _block(ranges, [], None)
    assert isinstance(json.loads(block.to_json())["kafka"], list)
    assert parse_meta(block.to_json(), where="test") == block


def test_a_committed_list_form_meta_json_and_raft_entry_still_read() -> None:
    """The previous release wrote these (tests/fixtures/old_forms/generate.py): one block of 12 partitions."""
    old_meta = (OLD_FORMS / "meta-12-partitions.json").read_bytes()
    old_entry = (OLD_FORMS / "commit-12-partitions.json").read_bytes()
    assert isinstance(json.loads(old_meta)["kafka"], list)
    block = parse_meta(old_meta, where="old")
    assert [(r.partition, r.start, r.end) for r in block.kafka][:2] == [(0, 1_000_003, 1_000_006),
                                                                      (1, 8_000_024, 8_000_028)]
    assert {r.incarnation for r in block.kafka} == {"Xw2aZ7kVQ0-3bq_PeR8m1A"}
    assert block.datasets[0].row_group_partitions == list(range(12))
    command = decode(old_entry)
    assert isinstance(command, CommitIngestBatch)
    assert command.blocks == [block]
    assert [(r.partition, r.stored) for r in command.ranges] == [(p, 3 + p % 4) for p in range(12)]
    # Written again, both are packed, and read back the same.
    assert isinstance(json.loads(block.to_json())["kafka"], str)
    assert parse_meta(block.to_json(), where="new") == block
    assert decode(encode(command)) == command
    assert len(encode(command)) < len(old_entry) / 2


def _packed(payload: bytes) -> str:
    return PACKED_TAG + base64.b64encode(zlib.compress(payload)).decode()


def _payload(header: object, columns: bytes) -> str:
    head = json.dumps(header).encode()
    return _packed(len(head).to_bytes(4, "little") + head + columns)


@pytest.mark.parametrize(("value", "says"), [
    ("z9:AAAA", "starts with 'z1:'"),
    ("z1:not base64!", "not base64 of zlib"),
    ("z1:" + base64.b64encode(b"not zlib").decode(), "not base64 of zlib"),
    (PACKED_TAG + base64.b64encode(zlib.compress(b"abc")[:-3]).decode(), "cut short"),
    (_payload([], b"\x01\x01\x01\x00"), "bytes after its columns"),
    (_payload({}, b""), "not a list of [topic, incarnation, count]"),
    (_packed(b"\x08\x00\x00\x00{nojson}"), "header is not JSON"),
    (_payload([["a", "", 2]], b"\x01\x00"), "truncated"),
    (_payload([["a", "", 1]], b"\x01\xff\x01\x00\x01\x00"), "negative partition"),
    (_payload([["a", "", 1]], b"\x01\x00\x01\x05\x01\xff"), "end before its start"),
    (_payload([["a", "", 1]], b"\x03\x00"), "width 3"),
    (PACKED_TAG + base64.b64encode(zlib.compress(b"\x00" * 1001)).decode(), "inflates past 1000 bytes"),
])
def test_a_malformed_packed_value_is_a_clear_error_naming_the_block(value: str, says: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(packed, "MAX_UNPACKED", 1000)  # a client's zlib bomb inflates no further than this
    raw = json.loads(_block([], [], None).to_json())
    raw["kafka"] = value
    with pytest.raises(CorruptObjectError, match=r"meta.json of block .* is invalid: kafka: ") as caught:
        parse_meta(json.dumps(raw).encode(), where="test")
    assert says in str(caught.value)
    entry = json.loads(encode(CommitIngestBatch(group="backup", ranges=[], blocks=[])))
    entry["ranges"] = value
    with pytest.raises(CommandRejectedError, match="invalid CommitIngestBatch"):
        decode(json.dumps(entry).encode())


def test_a_packed_range_is_checked_as_a_listed_one() -> None:
    raw = json.loads(_block([], [], None).to_json())
    for header in ([["a", "bad!", 1]], [["..", "", 1]]):
        raw["kafka"] = _payload(header, b"\x01\x00\x01\x00\x01\x01")
        with pytest.raises(CorruptObjectError, match="kafka"):
            parse_meta(json.dumps(raw).encode(), where="test")


def test_block_ids_and_contents_are_what_the_previous_release_wrote() -> None:
    """Block ids derive from the ranges (``shale.encoder.chunks``), not from the form of meta.json: the same
    inputs give the same block, now packed."""
    from tests.fixtures.old_forms.generate import written

    new_meta, new_entry = written()
    old = parse_meta((OLD_FORMS / "meta-12-partitions.json").read_bytes(), where="old")
    new = parse_meta(new_meta, where="new")
    assert isinstance(json.loads(new_meta)["kafka"], str)
    assert new.id == old.id == "01M7Q5FFCGPBB3E87EPPH19WDT"
    assert new.logical_key() == old.logical_key()
    assert new.model_dump(exclude={"files"}) == old.model_dump(exclude={"files"})  # the footers hold meta.json
    old_command, new_command = decode((OLD_FORMS / "commit-12-partitions.json").read_bytes()), decode(new_entry)
    assert isinstance(old_command, CommitIngestBatch)
    assert isinstance(new_command, CommitIngestBatch)
    assert new_command.ranges == old_command.ranges


def test_a_block_and_a_commit_of_many_unlike_partitions_take_at_most_32_bytes_a_partition() -> None:
    """Issue 55's target, counted in bytes: partitions whose offsets, lengths and times differ as a real topic's do
    (offsets around 3e9, up to 4,000 a batch, records from up to 5 minutes spread over up to 5 minutes). The list
    form took about 110 bytes a partition in meta.json and 210 in the Raft entry."""
    rng = random.Random(55)
    n = 2_000
    starts = [3_000_000_000 + rng.randrange(-50_000_000, 50_000_000) for _ in range(n)]
    lengths = [rng.randrange(4_000) for _ in range(n)]
    kafka = [KafkaRange(topic="orders", incarnation="Xw2aZ7kVQ0-3bq_PeR8m1A", partition=p, start=starts[p],
                        end=starts[p] + lengths[p]) for p in range(n)]
    lows = [BASE_MS - rng.randrange(300_000) for _ in range(n)]
    groups = [(lengths[p], lows[p], lows[p] + rng.randrange(300_000)) for p in range(n)]
    block = _block(kafka, groups, list(range(n)))
    ranges = [OffsetRange(**r.model_dump(), stored=r.end - r.start, bytes=(r.end - r.start) * rng.randrange(200, 1200))
              for r in kafka]
    command = CommitIngestBatch(group="backup", ranges=ranges, blocks=[block], lease=1)
    assert len(block.to_json()) / n <= 32
    assert len(encode(command)) / n <= 32


def test_json_for_people_lists_every_range() -> None:
    """``shale bucket inspect`` prints a block's metadata with context ``LISTED``: lists, however many."""
    n = 3 * PACK_FROM
    block = _block([KafkaRange(topic="a", partition=p, start=p, end=p + 1) for p in range(n)],
                   [(1, p, p + 1) for p in range(n)], list(range(n)))
    shown = block.model_dump(mode="json", context=LISTED)
    assert isinstance(shown["kafka"], list)
    assert isinstance(shown["datasets"][0]["row_groups"], list)
    assert isinstance(shown["datasets"][0]["row_group_partitions"], list)
    assert BlockMeta.model_validate(shown) == block
    assert isinstance(block.model_dump(mode="json")["kafka"], str)
