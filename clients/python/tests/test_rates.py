"""Rate strings as Flask-Limiter and ``limits`` users write them: the client
reads them as ``limits`` does (checked against the ``limits`` package), and
turns each into an exact rate argument for the module."""

from __future__ import annotations

from fractions import Fraction

import limits
import pytest

from tb_limiter import Limiter, parse_limits
from tb_limiter._rates import fraction_arg, rate_arg

SPELLINGS = [
    "100/minute",
    "10 per second",
    "10/second;1000/day",
    "5 per 10 seconds",
    "1/month",
    "2/year",
    "3 per hour, 4/day",
    "1 PER 2 HOURS|6/minutes",
]


@pytest.mark.parametrize("text", SPELLINGS)
def test_read_as_limits_reads_them(text: str) -> None:
    theirs = [(item.amount, item.get_expiry()) for item in limits.parse_many(text)]
    ours = [(lim.amount, lim.seconds) for lim in parse_limits(text)]
    assert ours == theirs


@pytest.mark.parametrize("text", ["100", "10/s", "per second", "10 per fortnight", "0 per 0 seconds"])
def test_other_strings_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_limits(text)


def test_every_spelling_is_accepted_by_both_backends(limiter: Limiter) -> None:
    for text in SPELLINGS:
        group = limiter.limits("rl:" + text, text)
        assert group.consume().allowed, text


def test_exact_rate_arguments() -> None:
    assert [lim.rate for lim in parse_limits("100/minute;5 per 10 seconds;1000/day")] == ["100/m", "0.5", "1000/d"]
    assert fraction_arg(Fraction(5, 3)) == "100/m"
    # No unit makes 1 per 30 days a terminating decimal: the closest rate the
    # module accepts at or below it (never above).
    for text, exact in [("1/month", Fraction(1, 2592000)), ("2/year", Fraction(2, 31104000))]:
        arg = parse_limits(text)[0].rate
        assert exact * (1 - Fraction(1, 10**5)) < per_second(arg) <= exact, (text, arg)
    assert rate_arg("0.5") == "0.5" and rate_arg(0.25) == "0.25" and rate_arg(Fraction(1, 4)) == "0.25"


def per_second(arg: str) -> Fraction:
    """The exact rate of a module rate argument ("0.5", "100/m")."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if arg[-2:-1] == "/":
        return Fraction(arg[:-2]) / units[arg[-1]]
    return Fraction(arg)
