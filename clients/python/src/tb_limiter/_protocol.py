"""What the sync and asyncio clients share: how each operation is spelled as
a command, how the backend is chosen, and the Lua fallback's source."""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from importlib import resources
from typing import Union

#: Source of the Lua fallback (``tb.lua`` in this package).
SCRIPT: str = resources.files(__package__).joinpath("tb.lua").read_text(encoding="utf-8")

#: A rate as the commands take it: ``"10"``, ``"0.5"``, ``"100/m"``, or a number.
RateLike = Union[str, int, float, Decimal, Fraction]

#: Key used to probe whether the server has the module (never written).
PROBE_KEY = "tb:probe"

#: The longest wait the module accepts by default (``tb.max-wait-ms``).
DEFAULT_TIMEOUT = 60.0


def rate_arg(rate: RateLike) -> str:
    """The rate as the commands' argument. Strings pass unchanged (``"100/m"``);
    floats use their shortest exact repr (``0.5`` -> ``"0.5"``)."""
    if isinstance(rate, bool):
        raise TypeError("rate must be a number or a string, not bool")
    if isinstance(rate, str):
        return rate
    if isinstance(rate, int):
        return str(rate)
    if isinstance(rate, float):
        if not math.isfinite(rate) or rate < 0:
            raise ValueError(f"rate must be finite and non-negative, got {rate!r}")
        return repr(rate)
    if isinstance(rate, Decimal):
        return format(rate, "f")
    if isinstance(rate, Fraction):
        if rate.denominator == 1:
            return str(rate.numerator)
        # Exact only when the denominator divides a power of ten; otherwise
        # the caller should pass a string such as "100/m".
        return format(Decimal(rate.numerator) / Decimal(rate.denominator), "f")
    raise TypeError(f"unsupported rate type {type(rate).__name__}")


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


@dataclass(frozen=True)
class Call:
    """One command: its name, its keys and its other arguments, in the order
    the module takes them (the key first; for TB.MCONSUME numkeys and the
    keys first)."""

    name: str
    keys: tuple[str | bytes, ...]
    args: tuple[str, ...]

    def module_args(self) -> tuple[str | bytes | int, ...]:
        """Arguments for ``execute_command`` on a server with the module."""
        if self.name == "TB.MCONSUME":
            return (self.name, len(self.keys), *self.keys, *self.args)
        return (self.name, *self.keys, *self.args)

    def script_args(self) -> list[str]:
        """ARGV for the Lua fallback: the command name, then its arguments."""
        return [self.name, *self.args]


def is_unknown_command(error: Exception) -> bool:
    """True for the server's reply to a command it does not know."""
    return "unknown command" in str(error).lower()
