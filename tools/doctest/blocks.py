"""Fenced code blocks of the documentation, with their doctest directives.

Every fenced block of README.md and docs/**/*.md is found with markdown-it-py
(the CommonMark parser, so fences inside list items and block quotes count
too). A block may be preceded, with nothing but blank lines between, by one
HTML comment that tells the harness how to treat it:

    <!-- doctest: WORD WORD KEY=VALUE KEY="VALUE WITH SPACES" -->

The vocabulary (DIRECTIVES below lists it) is kept small; runners.py says
what each word does. A ``<!-- doctest: ... -->`` comment that precedes no
fence, an unknown word, or a block with no language tag is an error of the
whole document, so nothing goes untested by accident.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from markdown_it import MarkdownIt

#: Directive words and keys, with what they mean (also printed by errors).
DIRECTIVES: dict[str, str] = {
    "output": "the block is what the block above it prints, compared with a real run: "
    "line for line, or with `part` a contiguous part of it; `tolerance=N%` lets each number "
    "differ by N% of the one shown (for measurements)",
    "part": "see output",
    "tolerance": "see output",
    "dry-run": "sh: checked (bash -n, and `make -n` for each make line) but not run: "
    "for commands that never end or that run this harness",
    "excerpt": "excerpt=FILE: the block is a verbatim excerpt of FILE, which make test "
    "compiles and runs",
    "file": "file=NAME: the block is the file NAME, written into the scratch directory "
    "of every later block of the same document (one of which must use it)",
    "servers": "servers=all: run on every server of TEST_SERVERS, not just the first",
    "server": "server=lua: a server without the module (the Lua fallback); "
    "server=none: no server",
    "config": 'config="NAME VALUE; NAME VALUE": extra redis.conf lines for the server',
    "serve": "serve=PORT: the block's first line starts a server that runs until Ctrl-C on "
    "PORT; it runs in the background on a free port put in place of PORT (also $PORT) "
    "while the other lines run, then it is stopped",
    "acl": "acl=USER:ALLOWS:DENIES (repeatable; ALLOWS and DENIES are comma-separated "
    "suites or command names): once the block is applied, USER (password from its "
    ">password rule) runs every command of the ALLOWS suites without error and gets NOPERM, "
    "changing nothing, for every attempt of the DENIES suites (aclcheck.py has the suites); "
    "runs on every server",
    "user": "user=NAME: run the block as the ACL user NAME of an earlier acl block of the "
    "same document, which is applied first (the URLs in the block get its name and password)",
    "xfail": "xfail REASON: the block is known to fail (strict: passing is an error, "
    "so the marker goes when the block is fixed)",
}

_DIRECTIVE = re.compile(r"^\s*<!--\s*doctest:(.*?)-->\s*$", re.S)
_ANY_DIRECTIVE = re.compile(r"<!--\s*doctest:", re.I)


class DocError(Exception):
    """A document the harness cannot test as written."""


@dataclass
class Block:
    """One fenced code block."""

    doc: Path
    #: 1-based line of the opening fence.
    line: int
    lang: str
    text: str
    #: Words without a value, in order (``output``, ``dry-run``, ``xfail``...).
    words: list[str] = field(default_factory=list)
    #: ``key=value`` settings of the directive.
    opts: dict[str, str] = field(default_factory=dict)
    #: Free text after ``xfail`` (its reason).
    reason: str = ""
    #: Why the block cannot be tested as written (it then fails alone).
    problem: str = ""
    #: ``acl=USER:ALLOWS:DENIES`` claims: (user, allows, denies).
    acl: list[tuple[str, list[str], list[str]]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.doc.name}:{self.line}:{self.lang}"

    def has(self, word: str) -> bool:
        return word in self.words


def parse_acl(value: str, where: str) -> tuple[str, list[str], list[str]]:
    """``USER:ALLOWS:DENIES`` -> (user, allows, denies)."""
    parts = value.split(":")
    if len(parts) != 3 or not parts[0] or not (parts[1] or parts[2]):
        raise DocError(f"{where}: acl= takes USER:ALLOWS:DENIES, not {value!r}")
    return parts[0], [s for s in parts[1].split(",") if s], [s for s in parts[2].split(",") if s]


def parse_directive(body: str, where: str) -> tuple[list[str], dict[str, str], str]:
    """Splits a directive's text into words, key=value options and an xfail
    reason (``acl=`` claims are kept in order under the key ``acl``, one per
    line)."""
    try:
        parts = shlex.split(body)
    except ValueError as e:
        raise DocError(f"{where}: unreadable doctest directive: {e}") from e
    words: list[str] = []
    opts: dict[str, str] = {}
    reason = ""
    for i, part in enumerate(parts):
        if part == "xfail":
            words.append(part)
            reason = " ".join(parts[i + 1 :])
            if not reason:
                raise DocError(f"{where}: xfail needs a reason")
            break
        key, eq, value = part.partition("=")
        if key not in DIRECTIVES:
            known = ", ".join(sorted(DIRECTIVES))
            raise DocError(f"{where}: unknown doctest directive {key!r} (known: {known})")
        if key == "acl":
            parse_acl(value, where)
            opts["acl"] = (opts["acl"] + "\n" + value) if "acl" in opts else value
        elif eq:
            opts[key] = value
        else:
            words.append(key)
    return words, opts, reason


def extract(doc: Path) -> list[Block]:
    """Every fenced block of ``doc``, with its directive; DocError on a misuse."""
    source = doc.read_text(encoding="utf-8")
    tokens = MarkdownIt("commonmark").parse(source)
    blocks: list[Block] = []
    used_comments: set[int] = set()
    for i, tok in enumerate(tokens):
        if tok.type == "code_block":
            line = tok.map[0] + 1 if tok.map else 0
            raise DocError(
                f"{doc.name}:{line}: an indented code block; use a fenced block with a "
                "language tag so the harness runs it"
            )
        if tok.type != "fence":
            continue
        line = tok.map[0] + 1 if tok.map else 0
        where = f"{doc.name}:{line}"
        lang = tok.info.strip().split()[0] if tok.info.strip() else ""
        words: list[str] = []
        opts: dict[str, str] = {}
        reason = ""
        problem = ""
        prev = tokens[i - 1] if i > 0 else None
        if prev is not None and prev.type == "html_block":
            m = _DIRECTIVE.match(prev.content)
            if m:
                used_comments.add(prev.map[0] if prev.map else -1)
                try:
                    words, opts, reason = parse_directive(m.group(1), where)
                except DocError as e:
                    problem = str(e)
        if not lang:
            problem = problem or (
                f"{where}: a fenced block without a language tag (```sh, ```console, "
                "```python, ```conf, ```rust, ```js...); a block that is not for copying "
                "says so with a doctest directive (see tools/doctest/blocks.py)"
            )
        acl = [parse_acl(v, where) for v in opts.get("acl", "").splitlines()]
        blocks.append(
            Block(doc, line, lang or "none", tok.content, words, opts, reason, problem, acl)
        )
    # A directive that precedes no fence (a typo, or text put between) is an error.
    for tok in tokens:
        start = tok.map[0] if tok.map else -1
        stray = tok.type == "html_block" and start not in used_comments
        stray = stray and bool(_ANY_DIRECTIVE.search(tok.content))
        if tok.type == "inline":
            stray = any(
                c.type == "html_inline" and _ANY_DIRECTIVE.search(c.content)
                for c in tok.children or []
            )
        if stray:
            raise DocError(
                f"{doc.name}:{start + 1}: a doctest directive that does not immediately "
                "precede a fenced block"
            )
    return blocks


def documents(root: Path) -> list[Path]:
    """README.md and every Markdown file under docs/."""
    docs = [root / "README.md"]
    docs += sorted((root / "docs").rglob("*.md"))
    return [d for d in docs if d.is_file()]
