"""Rates as users write them, turned into the module's rate argument.

Two spellings are accepted:

* the module's own: a decimal (``10``, ``"0.5"``, ``"1e-3"``) or ``N/s``,
  ``N/m``, ``N/h``, ``N/d`` (``"100/m"``): tokens per second, passed as is;
* the one of Flask-Limiter and ``limits``: ``"100/minute"``, ``"10 per
  second"``, ``"5 per 10 seconds"``, several joined by ``;``, ``,`` or
  ``|`` (``"10/second;1000/day"``). Each is a :class:`LimitSpec` of ``amount``
  per ``seconds``, kept as a bucket of capacity ``amount`` refilling at
  ``amount / seconds`` tokens per second.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Union

from ._catalogue import MAX_RATE_DEN

#: A rate as the commands take it: ``"10"``, ``"0.5"``, ``"100/m"``, a
#: number, or a ``limits``-style string such as ``"100/minute"``.
RateLike = Union[str, int, float, Decimal, Fraction]

#: Seconds per unit, as ``limits`` counts them (a month is 30 days, a year 12 months).
_UNITS = {
    "second": 1,
    "minute": 60,
    "hour": 3600,
    "day": 86400,
    "month": 30 * 86400,
    "year": 12 * 30 * 86400,
}
_LIMIT = re.compile(
    r"\s*([0-9]+)\s*(?:/|\s+per\s+|per)\s*([0-9]+)?\s*(second|minute|hour|day|month|year)s?\s*",
    re.IGNORECASE,
)
_SEPARATORS = re.compile(r"[,;|]")
#: The largest denominator of a rate's reduced fraction the module accepts.
_MAX_RATE_DEN = MAX_RATE_DEN
#: The module's units, widest first (the exact spelling with the largest unit
#: is the shortest).
_MODULE_UNITS = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))


@dataclass(frozen=True)
class LimitSpec:
    """``amount`` requests per ``seconds``, as ``limits`` writes it: a bucket
    of capacity ``amount`` refilling at ``amount / seconds`` per second. It
    admits at most ``amount + amount * T / seconds`` in any ``T`` seconds:
    the burst, then the average rate."""

    amount: int
    seconds: int
    text: str
    """How the caller wrote it, normalised (``"10/second"``, ``"5/10 seconds"``)."""

    @property
    def per_second(self) -> Fraction:
        """The refill rate, exact."""
        return Fraction(self.amount, self.seconds)

    @property
    def rate(self) -> str:
        """The rate as the module's argument."""
        return fraction_arg(self.per_second)

    @property
    def key_suffix(self) -> str:
        """A stable suffix naming this limit in a key (``10/1s``)."""
        return f"{self.amount}/{self.seconds}s"


def parse_limits(text: str) -> list[LimitSpec]:
    """Every limit of a ``limits``-style string (``"10/second;1000/day"``).
    Raises ValueError for anything else."""
    out: list[LimitSpec] = []
    for part in _SEPARATORS.split(text):
        m = _LIMIT.fullmatch(part)
        if not m:
            raise ValueError(f"not a rate limit string: {part.strip()!r} (write e.g. '100/minute' or '10 per second')")
        amount, multiples, unit = int(m.group(1)), int(m.group(2) or 1), m.group(3).lower()
        if multiples == 0:
            raise ValueError(f"a limit's period must be positive: {part.strip()!r}")
        period = f"{multiples} {unit}s" if multiples != 1 else unit
        out.append(LimitSpec(amount, multiples * _UNITS[unit], f"{amount}/{period}"))
    return out


def is_limits_string(text: str) -> bool:
    """True for a ``limits``-style string (it names a time unit in words)."""
    return bool(re.search(r"[a-z]{3,}", text, re.IGNORECASE)) and not _is_number_word(text)


def _is_number_word(text: str) -> bool:
    # "inf", "nan", "infinity": not rates the module takes, and not limits
    # strings either; the module answers them with its own error.
    return text.strip().lower() in ("inf", "infinity", "nan", "+inf", "-inf")


def rate_arg(rate: RateLike) -> str:
    """The rate as the commands' argument. Module spellings pass unchanged
    (``"100/m"``); floats use their shortest exact repr (``0.5`` -> ``"0.5"``);
    a single ``limits``-style limit becomes its exact per-second rate."""
    if isinstance(rate, bool):
        raise TypeError("rate must be a number or a string, not bool")
    if isinstance(rate, str):
        if is_limits_string(rate):
            limits = parse_limits(rate)
            if len(limits) != 1:
                raise ValueError(f"{rate!r} holds {len(limits)} limits: use limiter.limits(key, {rate!r})")
            return limits[0].rate
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
        return fraction_arg(rate)
    raise TypeError(f"unsupported rate type {type(rate).__name__}")


def rate_per_second(rate: str) -> Fraction:
    """The exact rate, in tokens per second, of a module rate argument
    (``"10"``, ``"2.5e3"``, ``"100/m"``)."""
    seconds = 1
    if len(rate) >= 2 and rate[-2] == "/":
        seconds = {"s": 1, "m": 60, "h": 3600, "d": 86400}[rate[-1].lower()]
        rate = rate[:-2]
    return Fraction(Decimal(rate)) / seconds


def fraction_arg(rate: Fraction) -> str:
    """An exact rate as the module's argument: a decimal per second, minute,
    hour or day when one of them is exact (``5/3`` -> ``"100/m"``). Else
    (``1/month``) the closest such decimal at or below the rate whose
    reduced fraction the module accepts (denominator at most 2^40): never
    above the rate asked for, within a millionth of it for realistic rates."""
    if rate < 0:
        raise ValueError(f"rate must be non-negative, got {rate}")
    for unit, seconds in _MODULE_UNITS[::-1]:
        text = _terminating_decimal(rate * seconds)
        if text is not None and Fraction(text).denominator * seconds // math.gcd(
            Fraction(text).numerator, seconds
        ) <= _MAX_RATE_DEN:
            return text if unit == "s" else f"{text}/{unit}"
    best: tuple[Fraction, str] | None = None
    for unit, seconds in _MODULE_UNITS:
        per_unit = rate * seconds
        for places in range(31):
            scale = 10**places
            numerator = per_unit.numerator * scale // per_unit.denominator
            value = Fraction(numerator, scale * seconds)
            if value.denominator > _MAX_RATE_DEN:
                break
            if numerator and (best is None or value > best[0]):
                text = format(Decimal(numerator).scaleb(-places), "f")
                best = (value, text if unit == "s" else f"{text}/{unit}")
    if best is None:
        raise ValueError(f"rate {rate} is too small for the module (below about 1e-12 per second)")
    return best[1]


def _terminating_decimal(x: Fraction) -> str | None:
    """``x`` as a plain decimal string when it has one (denominator 2^a 5^b)."""
    den = x.denominator
    twos = fives = 0
    while den % 2 == 0:
        den //= 2
        twos += 1
    while den % 5 == 0:
        den //= 5
        fives += 1
    if den != 1:
        return None
    places = max(twos, fives)
    value = Decimal(x.numerator * 10**places // x.denominator).scaleb(-places)
    return format(value.normalize(), "f")
