"""Prints, after the run, how many blocks of each language the docs hold
and how many runs they made (a block runs once per server it runs on; an
output block is checked with the block it follows)."""

from __future__ import annotations

from collections import Counter

import pytest


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    import blocks
    from runners import ROOT
    from test_docs import CASES

    found: Counter[str] = Counter()
    for doc in blocks.documents(ROOT):
        try:
            found.update(b.lang for b in blocks.extract(doc))
        except blocks.DocError:
            pass  # reported by test_documents_are_testable
    runs = Counter(c.block.lang for c in CASES)
    terminalreporter.write_line(
        f"docs blocks: {sum(found.values())}; by language (runs): "
        + ", ".join(f"{lang} {n} ({runs[lang]})" for lang, n in sorted(found.items()))
    )
