"""How each operation is spelled as a command, the Lua fallback's source, and
how the server's errors are read."""

from __future__ import annotations

import hashlib
import math
import re
import secrets
from dataclasses import dataclass
from importlib import resources
from typing import Union

from ._catalogue import DEFAULT_MAX_WAIT_MS as DEFAULT_MAX_WAIT_MS
from ._catalogue import ERR_FLOW_NAME as _FLOW_NAME_LINE
from ._catalogue import ERR_WAIT_EXCEEDS, MAX_LEASE_ID
from ._catalogue import ERR_WEIGHT as _WEIGHT_LINE
from ._catalogue import MAX_FLOW_NAME as MAX_FLOW_NAME
from ._catalogue import MAX_WEIGHT as MAX_WEIGHT

#: Source of the Lua fallback (``tb.lua`` in this package).
SCRIPT: str = resources.files(__package__).joinpath("tb.lua").read_text(encoding="utf-8")
#: Its SHA-1, as ``EVALSHA`` takes it.
SCRIPT_SHA: str = hashlib.sha1(SCRIPT.encode()).hexdigest()

#: The module's error for a wait above ``tb.max-wait-ms``, the setting's
#: value in parentheses (older modules send none).
_MAX_WAIT = re.compile(re.escape(ERR_WAIT_EXCEEDS[4:].replace(" ({})", "")) + r"(?: \((\d+)\))?")


def amount_arg(n: int, what: str = "n") -> str:
    """A token count as the commands' argument."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"{what} must be an int")
    return str(n)


def wait_ms(seconds: float) -> int:
    """A wait in seconds as whole milliseconds, rounded down so the server
    never makes the caller wait longer than asked."""
    if not seconds >= 0 or math.isinf(seconds):
        raise ValueError(f"a wait must be a finite number of seconds >= 0, got {seconds!r}")
    return int(seconds * 1000)


#: A flow's name as the calls take it (``flow=``): a tenant, a priority class.
FlowName = Union[str, bytes]

#: The module's error lines for a bad flow or weight (the longest name is
#: ``MAX_FLOW_NAME`` bytes, the largest weight ``MAX_WEIGHT``), as redis-py
#: shows them (without ``ERR``): the client raises them as ``ValueError``
#: before sending.
ERR_FLOW_NAME = _FLOW_NAME_LINE.removeprefix("ERR ")
ERR_WEIGHT = _WEIGHT_LINE.removeprefix("ERR ")


def flow_args(flow: FlowName | None, weight: int = 1) -> tuple[str | bytes, ...]:
    """``FLOW name [WEIGHT w]`` (WEIGHT left out when 1), or nothing without
    a flow. Checked as the module checks them, with its error lines
    (``ValueError``), so a bad flow makes no round trip; a ``str`` name is
    counted in UTF-8 bytes."""
    if isinstance(weight, bool) or not isinstance(weight, int):
        raise TypeError("weight must be an int")
    if flow is None:
        if weight != 1:
            raise ValueError(ERR_WEIGHT)
        return ()
    if not isinstance(flow, (str, bytes)):
        raise TypeError("flow must be a str or bytes")
    size = len(flow.encode()) if isinstance(flow, str) else len(flow)
    if not 1 <= size <= MAX_FLOW_NAME:
        raise ValueError(ERR_FLOW_NAME)
    if not 1 <= weight <= MAX_WEIGHT:
        raise ValueError(ERR_WEIGHT)
    return ("FLOW", flow) if weight == 1 else ("FLOW", flow, "WEIGHT", str(weight))


@dataclass(frozen=True)
class Call:
    """One command: its name, its keys and its other arguments, in the order
    the module takes them (the key first; for TB.MCONSUME numkeys and the
    keys first)."""

    name: str
    keys: tuple[str | bytes, ...]
    args: tuple[str | bytes, ...]

    def module_args(self) -> tuple[str | bytes | int, ...]:
        """Arguments for ``execute_command`` on a server with the module."""
        if self.name == "TB.MCONSUME":
            return (self.name, len(self.keys), *self.keys, *self.args)
        return (self.name, *self.keys, *self.args)

    def script_args(self) -> tuple[str | bytes, ...]:
        """ARGV for the Lua fallback: the command name, then its arguments;
        before them, for a call that may grant a lease, ``LEASE-SEED r``: the
        script cannot draw secure randomness, so its lease ids come from
        ``r``, a random integer from 1 to 2^53 - 1 drawn here (lua/tb.lua)."""
        if any(isinstance(a, str) and a.upper() == "LEASE" for a in self.args):
            seed = str(secrets.randbelow(LUA_MAX_LEASE_ID) + 1)
            return ("LEASE-SEED", seed, self.name, *self.args)
        return (self.name, *self.args)


#: Largest lease id (the module's and the Lua fallback's: 2^53 - 1).
LUA_MAX_LEASE_ID = MAX_LEASE_ID


def is_unknown_command(error: BaseException) -> bool:
    """True for the server's reply to a command it does not know, or a
    cluster client's refusal to route one (``... command doesn't exist in
    Redis commands``)."""
    text = str(error).lower()
    return "unknown command" in text or "command doesn't exist" in text


def is_noscript(error: BaseException) -> bool:
    """True for ``NOSCRIPT``: the script is not in the server's cache."""
    return str(error).startswith("NOSCRIPT") or type(error).__name__ == "NoScriptError"


def max_wait_error(error: BaseException) -> tuple[bool, int | None]:
    """Whether ``error`` is ``ERR wait exceeds tb.max-wait-ms (N)``, and N
    (the server's limit in ms) when the server says it (servers before this
    client's version do not)."""
    m = _MAX_WAIT.search(str(error))
    if not m:
        return False, None
    return True, int(m.group(1)) if m.group(1) else None
