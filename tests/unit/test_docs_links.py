"""The docs stand on their own (issue 59, point 6): every link and every path they name, in the README, docs/ and
the components' READMEs, is a file of this repository that exists. DESIGN.md once sent its readers to
`../shared/design/ARCHITECTURE.md`, outside the repository; a seed cited by number is named in DESIGN.md's table."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "src").rglob("README.md"))]

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
"""A Markdown link's target."""
PATH = re.compile(r"(?<![\w./-])((?:\.\./)+[\w./-]*[\w/]|(?:docs|src|tests|bench|deploy)/[\w./-]*[\w/])")
"""A path written in the text, linked or not: relative to the page (``../x``) or to the repository (``docs/x``).
It stops at a placeholder (``src/shale/<component>/``), so only its literal start is checked."""
SEED = re.compile(r"\bseeds? (\d{3}(?:(?:, | and |/)\d{3})*)\b")
"""A seed cited by number: "seed 002", "seeds 000 and 004"."""


def outside_or_missing(page: Path, text: str) -> list[str]:
    """The links and paths of ``page`` that leave the repository or name nothing."""
    targets = [(page.parent, t.split("#")[0]) for t in LINK.findall(text)
               if not re.match(r"[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]
    targets += [(page.parent if t.startswith("../") else ROOT, t) for t in PATH.findall(text)]
    bad = []
    for base, target in targets:
        resolved = (base / target).resolve()
        if not resolved.is_relative_to(ROOT) or not resolved.exists():
            bad.append(target)
    return bad


@pytest.mark.parametrize("page", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_and_path_is_a_file_of_the_repository(page: Path) -> None:
    assert outside_or_missing(page, page.read_text()) == []


def test_the_check_sees_a_link_outside_the_repository_and_a_missing_file() -> None:
    page = ROOT / "docs" / "DESIGN.md"
    text = ("The direction is `../shared/design/ARCHITECTURE.md`; see [the seeds](../../seeds/) and "
            "tests/unit/test_nothing_here.py, [CONFIG](CONFIG.md), [web](https://example.com/x) and docs/design/.")
    assert sorted(set(outside_or_missing(page, text))) == [
        "../../seeds/", "../shared/design/ARCHITECTURE.md", "tests/unit/test_nothing_here.py"]


def test_every_seed_cited_is_named_in_the_design() -> None:
    design = (ROOT / "docs" / "DESIGN.md").read_text()
    named = set(re.findall(r"^\| (\d{3}) \|", design, re.MULTILINE))
    cited = {number for page in DOCS for numbers in SEED.findall(page.read_text())
             for number in re.findall(r"\d{3}", numbers)}
    assert cited, "the pages cite seeds by number"
    assert cited <= named, f"name seeds {sorted(cited - named)} in DESIGN.md's table"
