"""docs/CONFIG.md is the configuration reference generated from the models (`shale config explain --markdown`):
one source, so the document cannot drift from what `shale config check` enforces."""

from __future__ import annotations

from pathlib import Path

from shale.config import ShaleConfig
from shale.config.explain import entries, render_markdown
from shale.config.parsers import installed_parsers

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
