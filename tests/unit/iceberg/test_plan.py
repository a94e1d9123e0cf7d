"""Which files a table holds (pure): whole objects where the generation is active throughout, copies where a
switch cuts, nothing where it is inactive; and the state at an earlier entry reconstructed from later changes."""

from __future__ import annotations

from tests.factories import BASE_MS
from tests.unit.metastore.helpers import meta

from shale.iceberg.plan import TableKey, blocks_at, desired, rules_at, table_files
from shale.index.changes import BlockChange

LOW, HIGH = BASE_MS, BASE_MS + 60_000


def test_files_follow_the_active_generation() -> None:
    g1 = meta(group="partition", generation=1, min_time=LOW, max_time=HIGH)
    g2 = meta(group="partition", generation=2, min_time=LOW, max_time=HIGH, key="g2")
    assert [f.intervals for f in table_files(g1, "app", [], 1)] == [None]
    assert table_files(g2, "app", [], 1) == []
    cut = [("app", LOW + 1000, HIGH + 5, 2)]
    assert [f.intervals for f in table_files(g1, "app", cut, 1)] == [((LOW, LOW + 999),)]
    assert [f.intervals for f in table_files(g2, "app", cut, 1)] == [((LOW + 1000, HIGH),)]
    assert table_files(g1, "other", [], 1) == []
    assert table_files(meta(group="backup"), "app", [], 1) == []
    files = table_files(g1, "app", cut, 1)
    assert files[0].copy_name() == table_files(g1, "app", cut, 1)[0].copy_name() != table_files(
        g1, "app", [("app", LOW + 2000, HIGH, 2)], 1)[0].copy_name()


def test_state_before_later_changes() -> None:
    a, b, c = (meta(group="partition", start=i * 10, end=i * 10 + 10) for i in range(3))
    later = [BlockChange(5, "remove", "acme", a.id), BlockChange(5, "add", "acme", c.id),
             BlockChange(6, "generations", "acme", "app"), BlockChange(7, "remove", "acme", "gone")]
    assert set(blocks_at({b.id: b, c.id: c}, {a.id: a}, later)) == {a.id, b.id}
    rules = [("app", 0, 1, 2), ("other", 0, 1, 3), ("app", 5, 9, 2)]
    assert rules_at(rules, "app", later) == [("app", 0, 1, 2)]
    assert rules_at(rules, "other", later) == [("other", 0, 1, 3)]
    assert set(desired([a, b], TableKey("acme", "app"), [], 1)) == {a.id, b.id}


def test_data_file_uris_name_their_block_and_whether_they_are_copies() -> None:
    from shale.block import block_file_key
    from shale.config import BucketConfig
    from shale.iceberg.catalog import object_uri
    from shale.iceberg.files import block_of, copy_key, is_copy, key_of

    block = meta(group="partition")
    spec = table_files(block, "app", [("app", LOW + 1000, HIGH + 5, 2)], 1)[0]
    for url in ("s3://bucket/prefix", "file:///tmp/shale-bucket"):
        bucket = BucketConfig(url=url)
        own = object_uri(bucket, block_file_key(block, spec.dataset.file))
        copy = object_uri(bucket, copy_key(block.tenant, spec.copy_name()))
        assert (block_of(own), block_of(copy)) == (block.id, block.id)
        assert (is_copy(own), is_copy(copy)) == (False, True)
        assert key_of(bucket, copy) == copy_key(block.tenant, spec.copy_name())
