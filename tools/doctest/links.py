"""Links between the documents: every relative link and image of a document
must name a file of the repository, and a ``#fragment`` a heading of the
page it points to (anchors made as GitHub makes them). The manual is split
over many pages, so a page moved or a heading renamed breaks links that no
code block would notice.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

from markdown_it import MarkdownIt
from markdown_it.token import Token

#: Documents whose links are written for another page: bench/report.py
#: writes this one-line summary for README.md, relative to the root.
NOT_CHECKED = {"docs/bench-summary.md"}


def _tokens(doc: Path) -> list[Token]:
    return MarkdownIt("commonmark").parse(doc.read_text(encoding="utf-8"))


def _text(inline: Token) -> str:
    """A heading's text as GitHub reads it for its anchor (markup dropped)."""
    return "".join(c.content for c in inline.children or [] if c.type in ("text", "code_inline"))


def anchor(title: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped,
    spaces made hyphens."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    """Every heading anchor of ``doc`` (a repeated heading gets -1, -2...)."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    tokens = _tokens(doc)
    for i, tok in enumerate(tokens):
        if tok.type == "heading_open":
            a = anchor(_text(tokens[i + 1]))
            n = seen.get(a, 0)
            seen[a] = n + 1
            out.add(a if n == 0 else f"{a}-{n}")
    return out


def targets(doc: Path) -> list[str]:
    """Every link and image address of ``doc``, in order."""
    found: list[str] = []
    for tok in _tokens(doc):
        for child in tok.children or []:
            if child.type == "link_open":
                found.append(str(child.attrs.get("href", "")))
            elif child.type == "image":
                found.append(str(child.attrs.get("src", "")))
    return found


def broken(doc: Path, root: Path) -> list[str]:
    """The relative links of ``doc`` that name no file of ``root``, or no
    heading of the page they name."""
    problems: list[str] = []
    for url in targets(doc):
        if re.match(r"^[a-z][a-z0-9+.-]*:", url, re.I):
            continue  # http:, https:, mailto:
        path, _, fragment = url.partition("#")
        target = (doc.parent / unquote(path)).resolve() if path else doc.resolve()
        if not target.exists() or root.resolve() not in [target, *target.parents]:
            problems.append(f"{url}: no such file in the repository")
        elif fragment and target.suffix == ".md" and unquote(fragment) not in anchors(target):
            problems.append(f"{url}: {target.name} has no heading #{fragment}")
    return problems
