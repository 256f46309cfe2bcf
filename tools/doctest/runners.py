"""How each kind of block runs. One function per language; RUNNERS maps the
language tag to it, and a tag missing from RUNNERS fails the block.

Every runnable block gets a fresh server (the module loaded, unless
``server=lua`` or ``server=none``; ``config=`` adds redis.conf lines) and an
environment pointing at it: ``6379`` in the block is replaced with the
server's port (so ``redis://127.0.0.1:6379/0``, ``redis-cli -p 6379`` and a
bare ``redis-cli``, through a wrapper first on PATH, all reach it), and
``REDIS_URL``, ``REDIS_PORT``, ``REDIS_SERVER`` and ``TB_MODULE`` are set.
Commands run in the repository's root, as a reader who cloned it would run
them, and must leave ``git status`` as they found it; Python runs with the
interpreter of the docs' venv (the client installed as users install it) in
a scratch directory.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from fractions import Fraction
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aclcheck
import servers
import transcript
from blocks import Block

ROOT = Path(__file__).resolve().parents[2]
BLOCK_TIMEOUT_S = 600.0
SERVE_DEADLINE_S = 120.0


class Failure(AssertionError):
    """A block that does not do what the document says."""


@dataclass
class Context:
    block: Block
    #: The server binary (from TEST_SERVERS) this run uses.
    binary: str
    #: ``file=`` blocks of the same document above this one: name -> text.
    files: dict[str, str]
    #: The block whose output this one's ``output`` follower shows.
    output: Block | None = None
    #: Earlier acl blocks of the same document, by user name.
    acl_blocks: dict[str, Block] = field(default_factory=dict)
    server: servers.Server | None = None
    #: With ``server=cluster``, every node (``server`` is the first).
    nodes: list[servers.Server] = field(default_factory=list)
    scratch: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="tb-doc-")))
    env: dict[str, str] = field(default_factory=dict)

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.port

    def text(self, block: Block | None = None) -> str:
        """The block's text pointed at this run's server (and user)."""
        b = block or self.block
        return self.point(b.text, run_as(b))

    def point(self, text: str, user: str | None) -> str:
        """``text`` with 6379 made this run's port, and redis:// URLs made
        to log in as ``user``."""
        if self.server is not None:
            text = re.sub(r"\b6379\b", str(self.server.port), text)
            if user:
                password = aclcheck.password_of(self.acl_blocks[user].text, user)
                text = re.sub(
                    rf"redis://(127\.0\.0\.1|localhost):{self.server.port}",
                    rf"redis://{user}:{password}@\1:{self.server.port}",
                    text,
                )
        return text


# --------------------------------------------------------------------------
# The environment every block runs in.


def _redis_cli() -> str:
    path = shutil.which("redis-cli")
    if path is None:
        raise RuntimeError("redis-cli is not installed: run `make deps`")
    return path


def prepare_env(ctx: Context) -> None:
    env = dict(os.environ)
    bin_dir = ctx.scratch / "bin"
    bin_dir.mkdir()
    env["PATH"] = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), env["PATH"]])
    env["TB_MODULE"] = servers.module_path()
    env["REDIS_SERVER"] = ctx.binary
    env["TMPDIR"] = str(ctx.scratch)
    user = run_as(ctx.block)
    if ctx.server is not None:
        env["REDIS_URL"] = ctx.server.url
        if user:
            password = aclcheck.password_of(ctx.acl_blocks[user].text, user)
            env["REDIS_URL"] = f"redis://{user}:{password}@127.0.0.1:{ctx.server.port}/0"
        env["REDIS_PORT"] = str(ctx.server.port)
        wrapper = bin_dir / "redis-cli"
        # Port first: a -p in the block (already rewritten) comes later and wins.
        login = ""
        if user:  # the password through the environment: no warning printed
            login = f" --user {user}"
            env["REDISCLI_AUTH"] = aclcheck.password_of(ctx.acl_blocks[user].text, user)
        wrapper.write_text(
            f'#!/bin/sh\nexec {_redis_cli()} -p {ctx.server.port}{login} "$@"\n'
        )
        wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    for name, text in ctx.files.items():
        (ctx.scratch / name).parent.mkdir(parents=True, exist_ok=True)
        (ctx.scratch / name).write_text(ctx.point(text, user))
    # Python blocks and background commands import the file= blocks.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ctx.scratch), env.get("PYTHONPATH")]))
    # Ruby blocks and background commands (a Sidekiq worker) load the gem
    # as `make ruby-gem` installed it.
    env["GEM_HOME"] = str(RUBY_GEM_HOME)
    ctx.env = env


def _git_status() -> str:
    return subprocess.run(
        ["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout


@contextmanager
def leaves_repo_clean() -> Iterator[None]:
    before = _git_status()
    yield
    after = _git_status()
    if after != before:
        raise Failure(f"the block changed the repository:\nbefore:\n{before}\nafter:\n{after}")


def _run(args: list[str], ctx: Context, cwd: Path, what: str) -> str:
    """Runs a process to completion; Failure with its output when it fails."""
    try:
        out = subprocess.run(
            args, cwd=cwd, env=ctx.env, capture_output=True, text=True,
            timeout=BLOCK_TIMEOUT_S, start_new_session=True,
        )
    except subprocess.TimeoutExpired as e:
        raise Failure(f"{what} still running after {BLOCK_TIMEOUT_S} s") from e
    if out.returncode != 0:
        raise Failure(
            f"{what} exited with {out.returncode}\n--- stdout:\n{out.stdout[-4000:]}"
            f"\n--- stderr:\n{out.stderr[-4000:]}"
        )
    return out.stdout


def check_output(ctx: Context, printed: str) -> None:
    """Compares what the block printed with the ``output`` block after it:
    line for line (trailing spaces aside), or as a contiguous ``part`` of
    it; with ``tolerance=N%`` each number may differ by N% of the one shown
    (whitespace runs then count as one space)."""
    if ctx.output is None:
        return
    shown = [line.rstrip() for line in ctx.output.text.rstrip("\n").splitlines()]
    real = [line.rstrip() for line in printed.rstrip("\n").splitlines()]
    tolerance = ctx.output.opts.get("tolerance")
    pct = Fraction(tolerance.removesuffix("%")) / 100 if tolerance else Fraction(0)
    starts = range(len(real) - len(shown) + 1) if ctx.output.has("part") else [0]
    if not ctx.output.has("part") and len(real) != len(shown):
        starts = []
    best: list[str] = []
    for start in starts:
        diffs = [
            f"shown {s!r}\n  printed {r!r}"
            for s, r in zip(shown, real[start : start + len(shown)])
            if not _same_line(s, r, pct)
        ]
        if not diffs:
            return
        if not best or len(diffs) < len(best):
            best = diffs
    raise Failure(
        f"{ctx.output.name} does not show what the block prints"
        + (f" (numbers within {tolerance})" if tolerance else "") + ":\n"
        + "\n".join(best[:10]) + "\n--- printed:\n" + "\n".join(real)
    )


_NUMBER = re.compile(r"(-?\d+(?:\.\d+)?)")


def _same_line(shown: str, real: str, pct: Fraction) -> bool:
    if shown == real:
        return True
    if not pct:
        return False
    a, b = _NUMBER.split(" ".join(shown.split())), _NUMBER.split(" ".join(real.split()))
    if len(a) != len(b):
        return False
    for i, (x, y) in enumerate(zip(a, b)):
        if i % 2 == 0:
            if x != y:
                return False
        elif abs(Fraction(y) - Fraction(x)) > abs(Fraction(x)) * pct:
            return False
    return True


# --------------------------------------------------------------------------
# Runners.


def run_console(ctx: Context) -> None:
    with leaves_repo_clean():
        transcript.replay(ctx.text(), ctx.env, str(ROOT))


def run_sh(ctx: Context) -> None:
    script = ctx.scratch / "block.sh"
    text = ctx.text()
    if ctx.block.has("dry-run"):
        dry_run(ctx, text)
        return
    serve = ctx.block.opts.get("serve")
    with leaves_repo_clean():
        if serve:
            _run_serving(ctx, text, serve)
            return
        script.write_text("set -euo pipefail\n" + text)
        printed = _run(["bash", str(script)], ctx, ROOT, "the block")
    check_output(ctx, printed)


def dry_run(ctx: Context, text: str) -> None:
    """``dry-run``: the block's syntax (``bash -n``), every ``make TARGET``
    line with ``make -n``, and every ``apt-get install`` line simulated
    (``-s``: the packages exist in the configured sources)."""
    script = ctx.scratch / "block.sh"
    script.write_text(text)
    _run(["bash", "-n", str(script)], ctx, ROOT, "bash -n")
    for line in text.splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] == ["sudo"]:
            words = words[1:]
        if words[:1] == ["make"]:
            for target in [w for w in words[1:] if not w.startswith("-") and "=" not in w]:
                _run(["make", "-n", target], ctx, ROOT, f"make -n {target}")
        elif words[:2] == ["apt-get", "install"]:
            _run(["apt-get", "install", "-s", *words[2:]], ctx, ROOT, f"apt-get install -s ({line})")


def _run_serving(ctx: Context, text: str, doc_port: str) -> None:
    """``serve=PORT``: the first line serves on PORT until stopped."""
    port = servers.free_port()
    text = re.sub(rf"\b{re.escape(doc_port)}\b", str(port), text)
    first, _, rest = text.partition("\n")
    ctx.env["PORT"] = str(port)
    log = ctx.scratch / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            ["bash", "-c", first], cwd=ROOT, env=ctx.env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + SERVE_DEADLINE_S
        while True:
            if proc.poll() is not None:
                raise Failure(f"{first!r} exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise Failure(f"{first!r} did not listen on {port} within {SERVE_DEADLINE_S} s")
                time.sleep(0.1)
        script = ctx.scratch / "block.sh"
        script.write_text("set -euo pipefail\n" + rest)
        printed = _run(["bash", str(script)], ctx, ROOT, "the block")
    finally:
        _stop_group(proc)
    check_output(ctx, printed)


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """Stops a process started in its own session, and its children."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@contextmanager
def background(ctx: Context) -> Iterator[None]:
    """``background="COMMAND" ready=REGEX``: COMMAND (a worker, say) runs
    in the scratch directory, beside the file= blocks, from before the
    block until after it; the block starts once COMMAND has printed a line
    matching REGEX."""
    command = ctx.block.opts.get("background")
    if command is None:
        yield
        return
    ready = ctx.block.opts.get("ready")
    if not ready:
        raise Failure("background= needs ready=REGEX: the line that says it is ready")
    command = ctx.point(command, run_as(ctx.block))
    log = ctx.scratch / "background.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            ["bash", "-c", command], cwd=ctx.scratch, env=ctx.env, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        deadline = time.monotonic() + SERVE_DEADLINE_S
        while not re.search(ready, log.read_text(errors="replace"), re.M):
            if proc.poll() is not None:
                raise Failure(f"{command!r} exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
            if time.monotonic() > deadline:
                raise Failure(
                    f"{command!r} printed nothing matching {ready!r} within {SERVE_DEADLINE_S} s:"
                    f"\n{log.read_text()[-4000:]}"
                )
            time.sleep(0.1)
        yield
        if proc.poll() is not None:
            raise Failure(f"{command!r} exited during the block:\n{log.read_text()[-4000:]}")
    finally:
        _stop_group(proc)


def run_python(ctx: Context) -> None:
    script = ctx.scratch / "block.py"
    script.write_text(ctx.text())
    printed = _run([sys.executable, str(script)], ctx, ctx.scratch, "the block")
    check_output(ctx, printed)


# Settings the harness sets itself on the command line (they win).
_HARNESS_SETTINGS = {"port", "bind", "dir", "logfile", "daemonize", "pidfile"}
# Lines that are not CONFIG GET-able settings.
_NOT_CONFIG = {"loadmodule", "user", "include", "rename-command", "requirepass", "save"}
_UNITS = {"k": 1000, "kb": 1024, "m": 1000**2, "mb": 1024**2, "g": 1000**3, "gb": 1024**3}


def conf_for_server(text: str) -> str:
    """A redis.conf block with its ``loadmodule .../libtb.so`` pointed at TB_MODULE."""
    return re.sub(
        r"^(\s*loadmodule\s+)\S*libtb\.so", lambda m: m.group(1) + servers.module_path(),
        text, flags=re.M,
    )


def _normalize(value: str) -> str:
    v = value.strip().strip('"').lower()
    m = re.fullmatch(r"(\d+)(k|kb|m|mb|g|gb)", v)
    return str(int(m.group(1)) * _UNITS[m.group(2)]) if m else v


def check_conf(ctx: Context) -> None:
    """Every setting of a conf block is in force on the server it started."""
    assert ctx.server is not None
    admin = aclcheck.admin_client(ctx.server.port)
    problems = []
    for line in ctx.block.text.splitlines():
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        name = words[0].lower()
        if name == "loadmodule":
            if not any(m.get(b"name") == b"tb" for m in admin.module_list()):
                problems.append("the module is not loaded")
            continue
        if name in _NOT_CONFIG or name in _HARNESS_SETTINGS:
            continue
        got = admin.config_get(name)
        if name not in {k.decode() if isinstance(k, bytes) else k for k in got}:
            problems.append(f"{name}: CONFIG GET does not know it")
            continue
        raw = next(iter(got.values()))
        value = raw.decode() if isinstance(raw, bytes) else str(raw)
        if _normalize(value) != _normalize(" ".join(words[1:])):
            problems.append(f"{name}: the block sets {' '.join(words[1:])!r}, the server has {value!r}")
    if problems:
        raise Failure("the conf block is not in force:\n" + "\n".join(problems))


def run_conf(ctx: Context) -> None:
    # The server was started with the block as its redis.conf (see start_server).
    check_conf(ctx)


def run_excerpt(ctx: Context) -> None:
    """``excerpt=FILE``: the block is a verbatim excerpt of FILE (indentation
    aside), and FILE is one that make test builds or runs."""
    name = ctx.block.opts["excerpt"]
    path = ROOT / name
    if not path.is_file():
        raise Failure(f"excerpt={name}: no such file")
    want = ctx.block.text.rstrip("\n").splitlines()
    have = path.read_text().splitlines()
    if not _contains(have, want):
        raise Failure(f"the block is not a verbatim excerpt of {name}")
    if not _used_by_tests(path):
        raise Failure(
            f"{name} is named by no test and no make rule (Makefile, mk/, tests/, "
            "clients/*/tests/, examples/**/test_*)"
        )


def _used_by_tests(path: Path) -> bool:
    """Whether a make rule or a test names ``path`` (by its name without the
    extension, as ``cargo --example rust_client`` does)."""
    users = [ROOT / "Makefile", *(ROOT / "mk").glob("*.mk"), *(ROOT / "tests").rglob("*.rs")]
    users += [*(ROOT / "clients").glob("*/tests/**/*"), *(ROOT / "examples").rglob("test_*")]
    stem = path.stem
    return any(
        u.is_file() and u != path and stem in u.read_text(errors="replace") for u in users
    )


def _contains(have: list[str], want: list[str]) -> bool:
    if not want:
        return False
    first = want[0]
    for i, line in enumerate(have):
        if line.strip() != first.strip() or not line.endswith(first):
            continue
        indent = line[: len(line) - len(first)]
        chunk = have[i : i + len(want)]
        if len(chunk) == len(want) and all(
            (h == indent + w) or (not w.strip() and not h.strip()) for h, w in zip(chunk, want)
        ):
            return True
    return False


def run_rust(ctx: Context) -> None:
    raise Failure(
        "a rust block must be an excerpt of a file that make test compiles and runs: "
        "put <!-- doctest: excerpt=examples/FILE.rs --> before it"
    )


NODE_PACKAGE = ROOT / "clients" / "node"


def run_js(ctx: Context) -> None:
    """An ES module (top-level await works), run by the Node client's
    clients/node/tools/run-block.js in a scratch directory of the user's
    project TB_NODE_PROJECT names, where tb-limiter is installed as users
    install it, outside the repository, beside the newest node-redis, ioredis
    and bullmq (``make node-installed`` makes it and prints its path)."""
    node = shutil.which("node")
    if node is None:
        raise RuntimeError("node is not installed: run `make node-deps`")
    project = os.environ.get("TB_NODE_PROJECT")
    if not project or not (Path(project) / "node_modules" / "tb-limiter").exists():
        raise RuntimeError(
            f"TB_NODE_PROJECT={project!r} is not a project with tb-limiter installed: run `make node-installed`"
        )
    ctx.env["TB_NODE_PROJECT"] = project
    script = ctx.scratch / "block.mjs"
    script.write_text(ctx.text())
    runner = NODE_PACKAGE / "tools" / "run-block.js"
    printed = _run([node, str(runner), str(script), str(int(BLOCK_TIMEOUT_S * 1000))], ctx, ctx.scratch, "the block")
    check_output(ctx, printed)


RUBY_GEM_HOME = ROOT / "target" / "ruby-gems"


def run_ruby(ctx: Context) -> None:
    """A Ruby script, run with Debian's ruby against the tb-limiter gem as
    ``make ruby-gem`` builds and installs it (target/ruby-gems), beside
    Debian's redis-rb and Sidekiq."""
    ruby = shutil.which("ruby")
    if ruby is None:
        raise RuntimeError("ruby is not installed: run `make ruby-deps`")
    if not list((RUBY_GEM_HOME / "gems").glob("tb-limiter-*")):
        raise RuntimeError(f"the tb-limiter gem is not installed in {RUBY_GEM_HOME}: run `make ruby-gem`")
    script = ctx.scratch / "block.rb"
    script.write_text(ctx.text())
    printed = _run([ruby, str(script)], ctx, ctx.scratch, "the block")
    check_output(ctx, printed)


RUNNERS: dict[str, Callable[[Context], None]] = {
    "console": run_console,
    "sh": run_sh,
    "bash": run_sh,
    "python": run_python,
    "conf": run_conf,
    "rust": run_rust,
    "js": run_js,
    "javascript": run_js,
    "ruby": run_ruby,
}


# --------------------------------------------------------------------------
# One block, one server.


def start_server(ctx: Context) -> None:
    b = ctx.block
    kind = b.opts.get("server", "module")
    if kind == "none":
        return
    if kind not in ("module", "lua", "cluster"):
        raise Failure(f"unknown server={kind} (module, lua, cluster or none)")
    conf = "\n".join(line.strip() for line in b.opts.get("config", "").split(";"))
    user = run_as(b)
    if user:
        if user not in ctx.acl_blocks:
            raise Failure(f"user={user}: no acl block above defines that user")
        if ctx.acl_blocks[user].lang == "conf":
            conf += "\n" + conf_for_server(ctx.acl_blocks[user].text)
    if b.lang == "conf":
        conf += "\n" + conf_for_server(b.text)
    conf += "\n" + aclcheck.ADMIN_CONF
    if b.acl:
        conf += "\n" + aclcheck.UNPROTECTED_CONF
    if kind == "cluster":
        ctx.nodes = servers.start_cluster(ctx.binary, conf_text=conf)
        ctx.server = ctx.nodes[0]
    else:
        ctx.server = servers.start(ctx.binary, module=kind == "module", conf_text=conf)


def run_block(ctx: Context) -> None:
    """Runs one block against one server; Failure when it does not do what
    the document says."""
    b = ctx.block
    try:
        if b.problem:
            raise Failure(b.problem)
        if "excerpt" in b.opts:
            run_excerpt(ctx)
            return
        runner = RUNNERS.get(b.lang)
        if runner is None:
            raise Failure(
                f"no runner for ```{b.lang} blocks (runners: {', '.join(sorted(RUNNERS))}); "
                "a block that is not for copying needs a doctest directive "
                "(tools/doctest/blocks.py)"
            )
        start_server(ctx)
        prepare_env(ctx)
        user = run_as(b)
        if user and ctx.acl_blocks[user].lang == "console":
            # Applied by the default user, as the document's reader would.
            transcript.replay(ctx.text(ctx.acl_blocks[user]), _default_user_env(ctx), str(ROOT))
        with background(ctx):
            runner(ctx)
        for user, allows, denies in b.acl:
            aclcheck.check(ctx.port, b.text, user, allows, denies)
    finally:
        for node in ctx.nodes or ([ctx.server] if ctx.server else []):
            servers.stop(node)
        shutil.rmtree(ctx.scratch, ignore_errors=True)


def _default_user_env(ctx: Context) -> dict[str, str]:
    """ctx.env with a redis-cli that logs in as the default user."""
    assert ctx.server is not None
    bin_dir = ctx.scratch / "bin-default"
    bin_dir.mkdir(exist_ok=True)
    wrapper = bin_dir / "redis-cli"
    wrapper.write_text(f'#!/bin/sh\nexec {_redis_cli()} -p {ctx.server.port} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    env = {k: v for k, v in ctx.env.items() if k != "REDISCLI_AUTH"}
    env["PATH"] = os.pathsep.join([str(bin_dir), env["PATH"]])
    return env


def run_as(block: Block) -> str | None:
    """The ACL user a block runs as."""
    return block.opts.get("user")
