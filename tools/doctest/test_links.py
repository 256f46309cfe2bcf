"""Every relative link of the docs (blocks.documents) resolves: the file
exists, and a ``#fragment`` names a heading of it (links.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

import blocks
import links
from runners import ROOT

DOCS = [d for d in blocks.documents(ROOT) if str(d.relative_to(ROOT)) not in links.NOT_CHECKED]


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(ROOT)))
def test_links_resolve(doc: Path) -> None:
    assert links.broken(doc, ROOT) == []


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other page\n\n## How `TB.TOP` counts\n")
    doc = tmp_path / "doc.md"
    doc.write_text(
        "[ok](other.md) [ok](other.md#how-tbtop-counts) [ok](#title) [web](https://x.org/a)\n"
        "[gone](missing.md) [no heading](other.md#nothing) ![img](pic.png)\n\n# Title\n"
    )
    assert links.broken(doc, tmp_path) == [
        "missing.md: no such file in the repository",
        "other.md#nothing: other.md has no heading #nothing",
        "pic.png: no such file in the repository",
    ]
