"""``console`` blocks: terminal transcripts, replayed and compared.

A transcript is ``$ command`` lines, each followed by exactly what the
terminal shows. Each command runs in bash with a pseudo-terminal as its
stdin, stdout and stderr, as it would in the reader's terminal (so
``redis-cli`` prints ``(integer) 5``; piped into another command it prints
``5``, as it does there too). The output must match line for line, with one
exception, the timing rule below.

Timing rule. A transcript shows what a run with no time between its
commands prints (``sleep N`` lines add N seconds). The harness measures the
*slack*: how much later than that ideal each command really ended. Only the
fields of the limiter's replies that count time or refill may differ from
the document, only in the direction time moves, and only by what the slack
explains:

- countdowns (``retry_after_ms``, ``reset_after_ms``, ``ttl_ms``, the
  seconds of ``CL.THROTTLE``, ``PTTL``/``TTL``): between the document's value
  less the slack (plus 1 ms of clock rounding) and the document's value;
  -1 (never) is exact;
- token counts (``remaining``, ``tokens``, an ``ATMOST`` grant, the reply of
  ``TB.REFUND``): between the document's value and that plus rate x slack
  (its whole part for whole tokens: with no time between the commands,
  every count is whole);
- ``updated_at_ms`` (a wall-clock time): any time within the run.

Everything else (``allowed``, ``granted``, ``capacity``, ``rate``, errors,
field names, the shape of every line) must be identical.
"""

from __future__ import annotations

import math
import os
import pty
import re
import select
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from fractions import Fraction

COMMAND_TIMEOUT_S = 60.0


@dataclass
class Step:
    command: str
    expected: list[str] = field(default_factory=list)


def parse(text: str) -> list[Step]:
    """Splits a transcript into commands and the lines each is shown to print."""
    steps: list[Step] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("$ "):
            cmd = line[2:]
            while cmd.endswith("\\") and i + 1 < len(lines):
                i += 1
                cmd = cmd[:-1] + "\n" + lines[i].removeprefix("> ")
            steps.append(Step(cmd))
        elif not steps:
            raise ValueError(f"a console block must start with a `$ ` command line, not {line!r}")
        else:
            steps[-1].expected.append(line)
        i += 1
    if not steps:
        raise ValueError("a console block with no `$ ` command line")
    return steps


def run_in_pty(command: str, env: dict[str, str], cwd: str) -> str:
    """Runs ``command`` in bash on a new pseudo-terminal; returns what it showed."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        ["bash", "-c", command],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + COMMAND_TIMEOUT_S
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{command!r} still running after {COMMAND_TIMEOUT_S} s")
            ready, _, _ = select.select([master], [], [], min(left, 1.0))
            if not ready:
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every process holding the terminal has exited
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(master)
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
        proc.wait()
    return b"".join(chunks).decode("utf-8", "replace").replace("\r\n", "\n")


# --------------------------------------------------------------------------
# The timing rule: which reply fields depend on time, and how much.


@dataclass
class Tokens:
    """A token count refilled at ``rate`` tokens per second."""

    rate: Fraction


@dataclass
class Countdown:
    """A wait counted down in units of ``unit_ms`` milliseconds."""

    unit_ms: int


@dataclass
class Clock:
    """A wall-clock time in milliseconds."""


Rule = Tokens | Countdown | Clock

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# redis-cli options that take a value.
_CLI_VALUE_OPTS = {"-h", "-p", "-s", "-a", "-u", "-n", "-r", "-i", "-d", "-D", "--user", "--pass"}


def parse_rate(text: str) -> Fraction | None:
    """A rate as TB.CONSUME takes it (``10``, ``0.5``, ``1e-3``, ``100/m``)."""
    num, slash, unit = text.partition("/")
    try:
        value = Fraction(Decimal(num))
    except (InvalidOperation, ValueError):
        return None
    if slash:
        if unit not in _UNITS:
            return None
        value /= _UNITS[unit]
    return value


def redis_cli_argv(command: str) -> list[str] | None:
    """The Redis command of a plain ``redis-cli ... CMD args`` line (no pipe,
    no redirection), without redis-cli's own options; None otherwise."""
    try:
        words = shlex.split(command, comments=True)
    except ValueError:
        return None
    if not words or os.path.basename(words[0]) != "redis-cli":
        return None
    if any(w in ("|", "||", "&&", ";", ">", "<", ">>") for w in words):
        return None
    i = 1
    while i < len(words) and words[i].startswith("-"):
        i += 2 if words[i] in _CLI_VALUE_OPTS else 1
    return words[i:] or None


def rules_for(argv: list[str], rates: dict[str, Fraction], expected: list[str]) -> dict[int, Rule]:
    """Element index (1-based) -> rule, for the reply of ``argv``. ``rates``
    remembers each key's rate from earlier commands (for TB.REFUND)."""
    name = argv[0].upper()
    args = argv[1:]
    ms = Countdown(1)
    try:
        if name == "TB.CONSUME" and len(args) >= 3:
            rate = parse_rate(args[1])
            if rate is None:
                return {}
            rates[args[0]] = rate
            rules: dict[int, Rule] = {2: Tokens(rate), 3: ms, 4: ms}
            if any(a.upper() == "ATMOST" for a in args[3:]):
                rules[5] = Tokens(rate)
            return rules
        if name == "TB.MCONSUME" and args:
            k = int(args[0])
            keys, limits = args[1 : 1 + k], args[1 + k :]
            rules = {2: ms}
            for j, key in enumerate(keys):
                rate = parse_rate(limits[3 * j])
                if rate is None:
                    return {}
                rates[key] = rate
                rules[3 + j] = Tokens(rate)
            return rules
        if name == "CL.THROTTLE" and len(args) >= 4:
            rate = Fraction(int(args[2]), int(args[3]))
            rates[args[0]] = rate
            return {3: Tokens(rate), 4: Countdown(1000), 5: Countdown(1000)}
        if name == "TB.REFUND" and args and args[0] in rates:
            return {1: Tokens(rates[args[0]])}
        if name == "TB.INFO":
            # Field names are quoted on a terminal, bare with --raw.
            fields = [_value(line)[1].strip('"') for line in expected]
            named = dict(zip(fields[0::2], fields[1::2]))
            rate = parse_rate(named.get("rate", ""))
            rules = {}
            for j, f in enumerate(fields[0::2]):
                if f == "tokens" and rate is not None:
                    rules[2 * j + 2] = Tokens(rate)
                elif f in ("reset_after_ms", "ttl_ms"):
                    rules[2 * j + 2] = ms
                elif f == "updated_at_ms":
                    rules[2 * j + 2] = Clock()
            return rules
        if name == "PTTL":
            return {1: ms}
        if name == "TTL":
            return {1: Countdown(1000)}
    except (ValueError, IndexError, ZeroDivisionError):
        return {}
    return {}


_ARRAY_LINE = re.compile(r"^(\s*(\d+)\) )(.*)$")


def _value(line: str) -> tuple[str, str]:
    """(prefix, value) of an output line: ``' 2) '`` and ``'"4.5"'``."""
    m = _ARRAY_LINE.match(line)
    return (m.group(1), m.group(3)) if m else ("", line)


def _number(value: str) -> tuple[str, Decimal] | None:
    """The wrapper (``(integer) ``, ``"`` or none) and number of a value."""
    for wrap, inner in (("(integer) ", value.removeprefix("(integer) ")), ('"', value.strip('"'))):
        if value.startswith(wrap) and (wrap != '"' or value.endswith('"')):
            value = inner
            break
    else:
        wrap = ""
    try:
        return wrap, Decimal(value)
    except InvalidOperation:
        return None


@dataclass
class Timing:
    #: Seconds by which the command ended later than in a run with no delays.
    slack_s: float
    #: Wall-clock ms at the start and end of the run.
    start_ms: int
    end_ms: int


def check_value(rule: Rule, expected: str, actual: str, t: Timing) -> str | None:
    """None when ``actual`` is within ``rule``'s tolerance of ``expected``,
    else why not."""
    e, a = _number(expected), _number(actual)
    if e is None or a is None or e[0] != a[0]:
        return "not the same kind of value"
    ev, av = e[1], a[1]
    slack_ms = math.ceil(t.slack_s * 1000) + 1
    if isinstance(rule, Clock):
        if t.start_ms - 1 <= av <= t.end_ms + 1:
            return None
        return f"a time outside the run ({t.start_ms}..{t.end_ms} ms)"
    if isinstance(rule, Countdown):
        if ev == -1 or av == -1:
            return None if ev == av else "-1 (never) must match exactly"
        low = max(Decimal(0), ev - math.ceil(slack_ms / rule.unit_ms))
        if low <= av <= ev:
            return None
        return f"outside {low}..{ev} (countdown, slack {slack_ms} ms)"
    refill = Decimal(rule.rate.numerator) / Decimal(rule.rate.denominator) * Decimal(slack_ms)
    refill /= 1000
    # With no time between commands every count is whole, so a whole-token
    # field can grow only by the whole tokens the slack refills.
    high = ev + refill if "." in str(ev) or "." in str(av) else ev + math.floor(refill)
    if ev <= av <= high:
        return None
    return f"outside {ev}..{high} (tokens at {rule.rate}/s, slack {slack_ms} ms)"


def compare(step: Step, actual: list[str], t: Timing, rates: dict[str, Fraction]) -> list[str]:
    """Why ``actual`` is not what ``step`` shows (empty when it is)."""
    problems: list[str] = []
    if len(actual) != len(step.expected):
        return [f"{len(actual)} lines printed, {len(step.expected)} shown"]
    argv = redis_cli_argv(step.command)
    rules = rules_for(argv, rates, step.expected) if argv else {}
    for n, (exp, act) in enumerate(zip(step.expected, actual), start=1):
        if exp == act:
            continue
        (ep, ev), (ap, av) = _value(exp), _value(act)
        m = _ARRAY_LINE.match(exp)
        index = int(m.group(2)) if m else n
        rule = rules.get(index)
        if ep != ap or rule is None:
            problems.append(f"line {n}: shown {exp!r}, printed {act!r}")
            continue
        why = check_value(rule, ev, av, t)
        if why:
            problems.append(f"line {n}: shown {exp!r}, printed {act!r}: {why}")
    return problems


_SLEEP = re.compile(r"^\s*sleep\s+(\d+(?:\.\d+)?)\s*(?:#.*)?$")


def replay(text: str, env: dict[str, str], cwd: str) -> None:
    """Runs a transcript; AssertionError with the differences when it does
    not print what it shows."""
    steps = parse(text)
    rates: dict[str, Fraction] = {}
    ideal = 0.0
    start_ms = int(time.time() * 1000)
    t0 = time.monotonic()
    printed: list[str] = []
    problems: list[str] = []
    for step in steps:
        out = run_in_pty(step.command, env, cwd)
        actual = out.splitlines()
        m = _SLEEP.match(step.command)
        if m:
            ideal += float(m.group(1))
        timing = Timing(time.monotonic() - t0 - ideal, start_ms, int(time.time() * 1000))
        printed.append("$ " + step.command)
        printed.extend(actual)
        for p in compare(step, actual, timing, rates):
            problems.append(f"$ {step.command}\n    {p}")
    if problems:
        raise AssertionError(
            "the transcript does not match a real run:\n"
            + "\n".join(problems)
            + "\n--- the real run printed:\n"
            + "\n".join(printed)
        )
