"""Every fenced block of the docs (blocks.documents), run (``make test-docs``).

One test per block and server: the first server of TEST_SERVERS, or every
one for blocks whose behaviour differs by server (``servers=all``, every
acl block, and every console transcript unless ``servers=first``). A document the harness cannot read as written (a block
without a language, a misplaced or unknown directive) is one failing test.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

import blocks
import runners
import servers
from blocks import Block, DocError


@dataclass
class Case:
    block: Block
    binary: str
    files: dict[str, str]
    output: Block | None
    acl_blocks: dict[str, Block]


def plan(root: Path, binaries: list[str]) -> tuple[list[Case], list[str]]:
    """The test cases of every document under ``root``, and the errors that
    make a document untestable."""
    cases: list[Case] = []
    errors: list[str] = []
    for doc in blocks.documents(root):
        try:
            found = blocks.extract(doc)
            cases += plan_document(found, binaries)
        except DocError as e:
            errors.append(str(e))
    return cases, errors


def plan_document(found: list[Block], binaries: list[str]) -> list[Case]:
    cases: list[Case] = []
    files: dict[str, str] = {}
    acl_blocks: dict[str, Block] = {}
    for i, b in enumerate(found):
        if b.has("output"):
            prev = found[i - 1] if i > 0 else None
            if prev is None or prev.has("output") or "file" in prev.opts or prev.lang == "console":
                raise DocError(f"{b.name}: an output block must follow the block that prints it")
            continue
        if "file" in b.opts:
            name = b.opts["file"]
            # Named by a later block or its directive (a module by its import name).
            names = {name, name.removesuffix(".py")}
            later = [x.text + " ".join(x.opts.values()) for x in found[i + 1 :]]
            if not any(n in text for n in names for text in later):
                raise DocError(f"{b.name}: file={name} is used by no later block")
            files[name] = b.text
            continue
        follower = found[i + 1] if i + 1 < len(found) and found[i + 1].has("output") else None
        # Transcripts are cheap and show the module's replies: every server.
        everywhere = b.opts.get("servers", "all" if b.lang == "console" else "") == "all"
        everywhere = everywhere or bool(b.acl)
        for binary in binaries if everywhere else binaries[:1]:
            cases.append(Case(b, binary, dict(files), follower, dict(acl_blocks)))
        for user, _, _ in b.acl:
            acl_blocks[user] = b
    return cases


ROOT = runners.ROOT
BINARIES = servers.test_servers()
LABELS = {b: servers.server_label(b) for b in BINARIES}
CASES, ERRORS = plan(ROOT, BINARIES)


@pytest.mark.parametrize("error", ERRORS or [None], ids=lambda e: "documents")
def test_documents_are_testable(error: str | None) -> None:
    assert error is None, error


def _param(case: Case) -> object:
    marks = []
    if case.block.has("xfail"):
        marks.append(pytest.mark.xfail(strict=True, reason=case.block.reason))
    ident = f"{case.block.name}-{LABELS[case.binary]}"
    return pytest.param(case, marks=marks, id=ident)


#: DOCTEST_LANGS: ``python`` runs only the python blocks, ``-python`` all
#: but them. ``make test-docs`` runs the python blocks with the client
#: installed from its wheel, again from its sdist, then the others (one of
#: which is a ``pip install ./clients/python`` into the running venv).
LANGS = os.environ.get("DOCTEST_LANGS", "")


def selected(case: Case) -> bool:
    if LANGS.startswith("-"):
        return case.block.lang != LANGS[1:]
    return not LANGS or case.block.lang == LANGS


@pytest.mark.parametrize("case", [_param(c) for c in CASES if selected(c)])
def test_block(case: Case) -> None:
    ctx = runners.Context(
        block=case.block,
        binary=case.binary,
        files=case.files,
        output=case.output,
        acl_blocks=case.acl_blocks,
    )
    runners.run_block(ctx)
