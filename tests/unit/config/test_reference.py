"""docs/CONFIG.md is the configuration reference generated from the models (`shale config explain --markdown`):
one source, so the document cannot drift from what `shale config check` enforces."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st
from pydantic import BaseModel

from shale.config import ShaleConfig
from shale.config.explain import entries, render_markdown
from shale.config.parsers import installed_parsers
from shale.config.types import MAX_DURATION, format_duration, format_size, parse_duration, parse_size

DOC = Path(__file__).resolve().parents[3] / "docs" / "CONFIG.md"


def test_the_reference_in_docs_is_the_one_the_models_generate() -> None:
    assert DOC.read_text() == render_markdown(), "regenerate it: shale config explain --markdown > docs/CONFIG.md"


def test_every_field_and_every_parser_option_is_in_the_reference_with_a_meaning() -> None:
    text = DOC.read_text()
    found = list(entries(ShaleConfig))
    assert {e.key.split(".")[0] for e in found} == set(ShaleConfig.model_fields)
    for parser in installed_parsers():
        assert f"`ingest.parsers.options ({parser})`" in text
    for key in ("ingest.parsers.options.time_format", "ingest.tenants.tenant", "block.sync_delay"):
        assert f"`{key}`" in text
    undocumented = [e.key for e in found if not e.meaning and "." in e.key]
    assert undocumented == [], "give these fields a description"


def test_defaults_are_shown_as_they_are_written_in_shale_toml() -> None:
    # Issue 59, point 6: CONFIG.md showed block.sync_delay's default as `900.0`; a reader writes "15m".
    text = DOC.read_text()
    assert re.search(r'^\| `block\.sync_delay` \| duration [^|]* \| `"15m"` \|', text, re.MULTILINE)
    checked = 0
    for e in entries(ShaleConfig):
        if e.type.startswith(("duration", "size")) and e.default not in ("", "null"):
            shown = json.loads(e.default)
            assert isinstance(shown, str), f"{e.key}: default {e.default} is a bare number"
            parse = parse_duration if e.type.startswith("duration") else parse_size
            model = _model_of(e.key)
            if model is not None:
                assert parse(shown) == model.model_fields[e.key.rsplit(".", 1)[1]].get_default(), e.key
                checked += 1
    assert checked >= 20


def _model_of(key: str) -> Any:
    """The model holding ``key``'s field, when every section on the way is one (not a list of tables)."""
    model: Any = ShaleConfig
    for section in key.split(".")[:-1]:
        field = model.model_fields.get(section)
        model = field.annotation if field is not None else None
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
    return model


@example(900.0)  # block.sync_delay's default
@example(5400.0)
@example(0.25)
@example(1e-05)
@example(90.5)
@given(st.floats(min_value=0, max_value=MAX_DURATION, allow_nan=False))
def test_a_spelled_duration_reads_back_exactly(seconds: float) -> None:
    assert parse_duration(format_duration(seconds)) == seconds


def test_durations_are_spelled_in_the_largest_units() -> None:
    assert [format_duration(s) for s in (0.0, 0.25, 1.5, 30.0, 900.0, 5400.0, 7200.0, 604800.0)] == [
        "0s", "250ms", "1.5s", "30s", "15m", "1h30m", "2h", "7d"]


@given(st.integers(min_value=0, max_value=2**50))
def test_a_spelled_size_reads_back_exactly(size: int) -> None:
    assert parse_size(format_size(size)) == size
    assert format_size(64 * 2**20) == "64MiB"
