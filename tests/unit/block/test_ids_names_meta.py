from __future__ import annotations

import json

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from shale.block import (
    BlockMeta,
    check_tenant,
    deterministic_block_id,
    new_block_id,
    parse_meta,
    ulid_time_ms,
)
from shale.block.ids import MAX_ULID_MS, ulid_time_prefix
from shale.block.layout import (
    LEGACY_LAYOUT,
    Place,
    block_file_key,
    block_prefix,
    blocks_prefixes,
    bucket_index_key,
    deletion_mark_key,
    meta_key,
    parse_block_key,
    parse_mark_key,
    tenant_of_dir,
)
from shale.errors import CorruptObjectError, InvalidNameError
from shale.metastore import AddBlocks


def test_deterministic_ids_repeat_and_differ_by_key() -> None:
    a = deterministic_block_id(1_795_000_000_000, "backup/1/t/0/0/100")
    assert a == deterministic_block_id(1_795_000_000_000, "backup/1/t/0/0/100")
    assert a != deterministic_block_id(1_795_000_000_000, "backup/1/t/0/0/101")
    assert ulid_time_ms(a) == 1_795_000_000_000
    assert new_block_id() != new_block_id()
    assert ulid_time_ms(new_block_id(42)) == 42


@given(st.integers(0, MAX_ULID_MS), st.integers(0, MAX_ULID_MS), st.text(max_size=8))
@example(0, 1, "")
@example(MAX_ULID_MS - 1, MAX_ULID_MS, "k")
def test_a_time_prefix_sorts_every_id_made_at_that_time_or_later_after_it(ms: int, other: int, key: str) -> None:
    """What a LIST with start_after relies on (BlockFetcher.sync since a time): an id made at ``other`` sorts after
    ``ms``'s prefix exactly when ``other`` is at or after ``ms``."""
    prefix = ulid_time_prefix(ms)
    assert prefix == deterministic_block_id(ms, key)[:10]
    assert ulid_time_ms(prefix + "0" * 16) == ms
    assert (deterministic_block_id(other, key) > prefix) is (other >= ms)


@pytest.mark.parametrize("name", ["acme", "team-7", "a", "t_1", "0abc"])
def test_good_tenants(name: str) -> None:
    assert check_tenant(name) == name


@pytest.mark.parametrize("name", ["", "../etc", "a/b", "Acme", "_shale", "-x", "a.b", "x" * 64, "a b", "é"])
def test_bad_tenants_are_clear_errors_never_paths(name: str) -> None:
    with pytest.raises(InvalidNameError, match="tenant"):
        check_tenant(name)
    with pytest.raises(InvalidNameError):
        meta_key(Place(name, new_block_id()))


def test_layout_round_trips() -> None:
    block = new_block_id()
    assert meta_key(Place("acme", block)) == f"group=backup/tenant=acme/{block}/meta.json"
    assert meta_key(Place("acme", block, layout=LEGACY_LAYOUT)) == f"acme/blocks/{block}/meta.json"
    day = Place("acme", block, "partition", {"dt": "2026-11-27", "hour": "13"})
    assert meta_key(day) == f"group=partition/tenant=acme/dt=2026-11-27/{block}/meta.json"
    assert meta_key(Place("acme", block, "partition")) == \
        f"group=partition/tenant=acme/dt=__HIVE_DEFAULT_PARTITION__/{block}/meta.json"
    assert deletion_mark_key("acme", block) == f"acme/markers/{block}-deletion-mark.json"
    assert bucket_index_key("acme") == "acme/bucket-index.json.gz"
    places = (Place("acme", block), Place("acme", block, layout=LEGACY_LAYOUT), day, Place("acme", block, "partition"))
    for place in places:
        parsed = parse_block_key(block_file_key(place, "records-0.parquet"))
        assert parsed is not None
        assert (parsed.tenant, parsed.block_id, parsed.name, parsed.prefix) == \
            ("acme", block, "records-0.parquet", block_prefix(place))
        assert any(parsed.prefix.startswith(p) for p in blocks_prefixes("acme"))
    assert parse_block_key("acme/markers/x") is None
    assert parse_block_key(f"../blocks/{block}/x") is None
    assert parse_block_key(f"group=partition/tenant=acme/{block}/x") is None  # a partition block has a day
    assert parse_block_key(f"group=backup/tenant=acme/dt=2026-11-27/{block}/x") is None
    assert parse_block_key(f"group=partition/tenant=acme/dt=27.11.2026/{block}/x") is None
    assert parse_block_key(f"group=other/tenant=acme/{block}/x") is None
    assert parse_mark_key(deletion_mark_key("acme", block)) == ("acme", block)


def test_a_tenant_cannot_be_mistaken_for_a_group_folder() -> None:
    assert tenant_of_dir("group=backup/") is None
    assert tenant_of_dir("group=backup/tenant=acme/") == tenant_of_dir("acme/") == "acme"
    with pytest.raises(InvalidNameError):
        check_tenant("group=backup")


def _meta(**changes: object) -> dict[str, object]:
    block = deterministic_block_id(1_795_000_000_000, "x")
    raw: dict[str, object] = {
        "version": 1, "id": block, "tenant": "acme", "group": "backup", "min_time": 1, "max_time": 2,
        "kafka": [{"topic": "app", "partition": 0, "start": 0, "end": 10}],
        "datasets": [{"name": "records/app", "kind": "records", "topic": "app", "file": "records-0.parquet",
                      "rows": 10, "bytes": 100, "min_time": 1, "max_time": 2}],
        "files": [{"name": "records-0.parquet", "size": 50, "crc32": "0badf00d"}],
        "compaction": {"sources": [block]},
    }
    raw.update(changes)
    return raw


def test_meta_round_trips() -> None:
    raw = _meta()
    meta = parse_meta(json.dumps(raw).encode(), where="k", block_id=str(raw["id"]))
    assert isinstance(meta, BlockMeta)
    assert parse_meta(meta.to_json(), where="k") == meta
    assert meta.rows == 10
    assert meta.size == 50


def test_a_validated_meta_keeps_its_time_inside_commands_and_copies() -> None:
    meta = parse_meta(json.dumps(_meta()).encode(), where="k")
    assert meta.time_ms == ulid_time_ms(meta.id) > 0
    command = AddBlocks(blocks=[meta])
    assert command.blocks[0].time_ms == meta.time_ms
    assert AddBlocks.model_validate_json(command.model_dump_json()).blocks[0].time_ms == meta.time_ms
    assert meta.model_copy(update={"level": 2}).time_ms == meta.time_ms
    with pytest.raises(ValueError, match="not a block id"):
        AddBlocks.model_validate({"blocks": [_meta(id="not-a-ulid")]})


@pytest.mark.parametrize(("changes", "message"), [
    ({"version": 7}, "has version 7; this Shale reads version 1"),
    ({"group": "nope"}, "group 'nope'"),
    ({"tenant": "../x"}, "tenant"),
    ({"max_time": 0}, "before min_time"),
    ({"kafka": [{"topic": "app", "partition": 0, "start": 5, "end": 1}]}, "before start"),
    ({"files": [{"name": "other", "size": 1, "crc32": "00000000"}]}, "not listed in files"),
    ({"unknown_field": 1}, "unknown_field"),
    ({"compaction": {"sources": ["not-a-ulid"]}}, "not a block id"),
])
def test_invalid_meta_is_a_corrupt_object_error_naming_the_block(changes: dict[str, object], message: str) -> None:
    raw = _meta(**changes)
    with pytest.raises(CorruptObjectError, match=message) as info:
        parse_meta(json.dumps(raw).encode(), where="acme/blocks/X/meta.json", block_id=str(raw["id"]))
    assert str(raw["id"]) in str(info.value)


def test_garbage_and_misplaced_meta_are_rejected() -> None:
    with pytest.raises(CorruptObjectError, match="not JSON"):
        parse_meta(b"\x00{", where="k", block_id="B")
    raw = _meta()
    other = new_block_id()
    with pytest.raises(CorruptObjectError, match="lives in folder"):
        parse_meta(json.dumps(raw).encode(), where="k", block_id=other)
