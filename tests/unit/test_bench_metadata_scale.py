"""The metadata scale benchmark loads its big tenants with blocks copied from templates: they must be the blocks its
validated builder makes. And a tiny run of it measures every figure its ratios need."""

from __future__ import annotations

from typing import Any

import pytest
from bench import metadata_scale
from hypothesis import example, given
from hypothesis import strategies as st

from shale.index.records import encode_meta


@given(i=st.integers(0, 2_000_000))
@example(i=0)
@example(i=23)
def test_a_loaded_block_is_the_block_its_builder_makes(i: int) -> None:
    built, loaded = metadata_scale._block("t", i), metadata_scale._loaded_block("t", i)
    assert loaded == built
    assert loaded.time_ms == built.time_ms
    assert encode_meta(loaded) == encode_meta(built)


def test_a_tiny_run_measures_every_ratio(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metadata_scale, "COMMITS", 1)
    monkeypatch.setattr(metadata_scale, "ADDS", 1)
    monkeypatch.setattr(metadata_scale, "QUERIES", 2)
    result: dict[str, Any] = metadata_scale.measure((2, 4), (600, 1200), raft=False)
    assert set(result["ratios"]) == {"apply_per_partition_10000_vs_100", "index_bytes_per_block_10000_vs_100",
                                     "add_blocks_1m_vs_10k", "query_plan_1m_vs_10k"}
    assert all(v > 0 for v in result["ratios"].values())
    assert result["figures"]["parts_per_query_600"] > 0
    assert "query_plan_ms_1200" in result["figures"]
