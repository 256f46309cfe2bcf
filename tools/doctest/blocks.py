"""Fenced code blocks of the documentation, with their doctest directives.

Every fenced block of README.md, docs/**/*.md, clients/*/README.md and
examples/*/README.md is
found with markdown-it-py (the CommonMark parser, so fences inside list
items and block quotes count too) and run by its language (runners.py):

- ``console``: a terminal transcript (``$ command`` lines and what they
  print), replayed and compared (transcript.py has the timing rule);
- ``sh``/``bash``: run in the repository's root, which must stay clean;
- ``python``: run with the docs venv's interpreter;
- ``conf``: a redis.conf, loaded into a real server and read back;
- ``rust``: must be an ``excerpt=`` of a tested file;
- ``js``/``javascript``: the Node runner's hook;
- ``ruby``: run with ruby against the tb-limiter gem as installed by
  ``make ruby-gem``.

Any other language, a block without one, and an indented code block fail.
A block may be preceded, with nothing but blank lines between, by one HTML
comment that says what it is or what it needs:

    <!-- doctest: WORD WORD KEY=VALUE KEY="VALUE WITH SPACES" -->

DIRECTIVES below is the whole vocabulary. An unknown word fails its block;
a doctest comment that precedes no fence fails the document.
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
    "dry-run": "sh: checked but not run (bash -n; `make -n` for each make line; "
    "`apt-get install -s` for each apt-get install line): for commands that never end, "
    "change the machine, or run this harness",
    "excerpt": "excerpt=FILE: the block is a verbatim excerpt (indentation aside) of FILE, "
    "which a make rule or a test names",
    "file": "file=NAME: the block is the file NAME, written into the scratch directory "
    "of every later block of the same document (one of which must use it)",
    "servers": "servers=all: run on every server of TEST_SERVERS, not just the first "
    "(the default for console blocks; servers=first runs one of those on the first only)",
    "server": "server=lua: a server without the module (the Lua fallback); server=cluster: "
    "a three-master cluster (6379 in the block is its first node); server=none: no server",
    "config": 'config="NAME VALUE; NAME VALUE": extra redis.conf lines for the server',
    "serve": "serve=PORT: the block's first line starts a server that runs until Ctrl-C on "
    "PORT; it runs in the background on a free port put in place of PORT (also $PORT) "
    "while the other lines run, then it is stopped",
    "background": 'background="COMMAND" ready=REGEX: COMMAND (a Celery worker, say) runs in '
    "the scratch directory beside the file= blocks while the block runs, which starts once "
    "COMMAND has printed a line matching REGEX; then it is stopped",
    "ready": "see background",
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


_ROOT = Path(__file__).resolve().parents[2]


def _where(doc: Path) -> str:
    """``doc`` relative to the repository's root when it is inside it."""
    try:
        return str(doc.resolve().relative_to(_ROOT))
    except ValueError:
        return doc.name


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
        """``README.md:16:console``: where the block is, from the repository's root."""
        return f"{_where(self.doc)}:{self.line}:{self.lang}"

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
                f"{_where(doc)}:{line}: an indented code block; use a fenced block with a "
                "language tag so the harness runs it"
            )
        if tok.type != "fence":
            continue
        line = tok.map[0] + 1 if tok.map else 0
        where = f"{_where(doc)}:{line}"
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
                f"{_where(doc)}:{start + 1}: a doctest directive that does not immediately "
                "precede a fenced block"
            )
    return blocks


def documents(root: Path) -> list[Path]:
    """README.md, every Markdown file under docs/, the client packages'
    READMEs (what pip and npm show their users) and the examples' READMEs."""
    docs = [root / "README.md"]
    docs += sorted((root / "docs").rglob("*.md"))
    docs += sorted(root.glob("clients/*/README.md"))
    docs += sorted(root.glob("examples/*/README.md"))
    return [d for d in docs if d.is_file()]
