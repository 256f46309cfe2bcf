"""The module and the Lua fallback agree reply for reply.

Both servers run the same calls and every reply (or error) is compared. The
timeline is controlled in three ways, so that no reply depends on when a call
happens to run:

* fresh keys at rates that refill nothing during a test (``0``, ``1e-12``:
  one nano-token takes 1000 s);
* buckets whose stored time lies an hour in the future: both implementations
  count elapsed time below zero as zero and never move the stored time back,
  so every call computes at that frozen instant, at any rate;
* buckets stored days to years in the past at slow rates, where the refill,
  computed exactly for the earliest and the latest instant the calls could
  have read, is the same nano-token count (checked, not assumed).
"""

from __future__ import annotations

import random
from decimal import Decimal
from fractions import Fraction
from typing import Any, Callable

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tbserver import Server
from tb_limiter import Limiter

NANOS = 10**9
MAX_AMOUNT = 2**53
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def exact_rate(rate: str) -> Fraction:
    """The rate the module parses from ``rate`` (valid strings only)."""
    unit = 1
    if len(rate) >= 2 and rate[-2] == "/":
        unit = UNITS[rate[-1].lower()]
        rate = rate[:-2]
    return Fraction(Decimal(rate)) / unit


def agree(m: Any, lua: Any) -> bool:
    """Equal replies, except that an integer beyond 2^53 (a wait of more than
    285,000 years) reaches Redis from Lua as the nearest double: the one
    documented difference in replies."""
    if isinstance(m, dict) and isinstance(lua, dict):
        return m.keys() == lua.keys() and all(agree(m[k], lua[k]) for k in m)
    if isinstance(m, list) and isinstance(lua, list):
        return len(m) == len(lua) and all(agree(a, b) for a, b in zip(m, lua))
    if isinstance(m, int) and isinstance(lua, int) and abs(m) > 2**53:
        return abs(m - lua) <= abs(m) * 2**-51
    return bool(m == lua)


class Pair:
    """The same database on both backends: a call goes to both and returns
    both answers (a reply, or the error text)."""

    def __init__(self, module_server: Server, plain_server: Server) -> None:
        self.servers = (module_server, plain_server)
        self.raw = tuple(s.client() for s in self.servers)
        self.limiters = (Limiter.from_url(module_server.url, backend="module"), Limiter.from_url(plain_server.url, backend="lua"))
        assert [lim.backend for lim in self.limiters] == ["module", "lua"]
        for r in self.raw:
            r.flushall()

    def both(self, fn: Callable[[Limiter], Any]) -> tuple[Any, Any]:
        out = []
        for lim in self.limiters:
            try:
                out.append(fn(lim))
            except redis.ResponseError as e:
                out.append(f"error: {e}")
        return out[0], out[1]

    def same(self, fn: Callable[[Limiter], Any], what: object = "") -> Any:
        m, lua = self.both(fn)
        assert agree(m, lua), f"{what}: module {m!r} != lua {lua!r}"
        return m

    def time_us(self) -> int:
        sec, usec = self.raw[0].time()
        return sec * 1_000_000 + usec

    def set_state(self, key: str, nanos: int, updated_us: int, rate: Fraction, capacity: int) -> None:
        """Stores the same bucket on both: TB.SETSTATE on the module, the
        script's hash fields on the other (no expiry on either)."""
        m, lua = self.raw
        m.execute_command("TB.SETSTATE", key, nanos, updated_us, rate.numerator, rate.denominator, capacity, 0)
        w, f = divmod(nanos, NANOS)
        lua.delete(key)
        lua.hset(key, mapping={"w": w, "f": f, "t": updated_us, "rn": rate.numerator, "rd": rate.denominator, "c": capacity})

    def expire_times(self, key: str) -> tuple[int, int]:
        """Absolute expiry in ms of the key on both (-1 none, -2 missing)."""
        return tuple(int(r.execute_command("PEXPIRETIME", key)) for r in self.raw)  # type: ignore[return-value]


@pytest.fixture
def pair(module_server: Server, plain_server: Server) -> Pair:
    return Pair(module_server, plain_server)


def call(*args: Any) -> Callable[[Limiter], Any]:
    """A raw command by its module spelling, through each limiter."""
    from tb_limiter import Call

    name = str(args[0]).upper()
    if name == "TB.MCONSUME":
        k = int(args[1])
        keys, rest = args[2 : 2 + k], args[2 + k :]
    else:
        keys, rest = args[1:2], args[2:]
    c = Call(name, tuple(keys), tuple(str(a) for a in rest))

    def run(lim: Limiter) -> Any:
        reply = lim.execute(c)
        if isinstance(reply, list):
            return [x.decode() if isinstance(x, bytes) else x for x in reply]
        return reply

    return run


def info_without_clock(key: str) -> Callable[[Limiter], Any]:
    """TB.INFO without ``updated_at_ms`` and ``ttl_ms`` (they tell the time)."""

    def run(lim: Limiter) -> Any:
        reply = call("TB.INFO", key)(lim)
        if reply is None:
            return None
        d = dict(zip(reply[0::2], reply[1::2]))
        d.pop("updated_at_ms")
        d.pop("ttl_ms")
        return d

    return run


# A shared sequence on fresh keys, where nothing refills during the test.
FRESH_SEQUENCE: list[tuple[Any, ...]] = [
    ("TB.CONSUME", "q", "0", "5"),
    ("TB.CONSUME", "q", "0", "5", "3"),
    ("TB.CONSUME", "q", "0", "5", "2"),  # 1 left: never (rate 0)
    ("TB.CONSUME", "q", "0", "5", "6"),  # above capacity: never
    ("TB.CONSUME", "q", "0", "5", "0"),  # peek
    ("TB.CONSUME", "q", "0", "5", "4", "ATMOST"),
    ("TB.CONSUME", "q", "0", "5", "1", "ATMOST"),
    ("TB.REFUND", "q", "2"),
    ("TB.CONSUME", "q", "0", "7", "2"),  # capacity change
    ("TB.REFUND", "q", "100"),
    ("TB.REFUND", "missing", "1"),
    ("TB.INFO", "missing"),
    ("TB.CONSUME", "slow", "1e-12", "10", "4"),
    ("TB.CONSUME", "slow", "1e-12", "10", "7"),
    ("TB.CONSUME", "slow", "1e-12", "10", "7", "RESERVE", "60000"),
    ("TB.CONSUME", "slow", "1e-12", "10", "7", "ATMOST"),
    ("TB.CONSUME", "slow", "1e-12", "10", "0"),
    ("TB.CONSUME", "slow", "2e-12", "10", "1"),  # rate change
    ("TB.CONSUME", "slow", "2e-12", "10", "1", "ATMOST"),
    ("TB.CONSUME", "slow", "2e-12", "10", "11"),
    ("TB.CONSUME", "fresh", "1e-12", "0", "0"),
    ("TB.CONSUME", "fresh", "1e-12", "0", "1"),
    ("TB.MCONSUME", "2", "{t}a", "{t}b", "0", "3", "1", "1e-12", "1000", "600"),
    ("TB.MCONSUME", "2", "{t}a", "{t}b", "0", "3", "1", "1e-12", "1000", "600"),
    ("TB.MCONSUME", "2", "{t}a", "{t}b", "0", "3", "1", "1e-12", "1000", "400"),
    ("TB.MCONSUME", "2", "{t}a", "{t}b", "0", "3", "9", "1e-12", "1000", "1"),
    ("TB.MCONSUME", "2", "{t}a", "{t}b", "0", "3", "1", "1e-12", "1000", "1", "RESERVE", "60000"),
    ("TB.MCONSUME", "2", "{t}a", "{t}a", "0", "3", "1", "0", "3", "1"),
    ("TB.MCONSUME", "1", "{t}a", "0", "3", "1", "FROB", "1"),
    ("TB.MCONSUME", "1", "{t}a", "0", "3", "1", "RESERVE", "60001"),
    # errors: same message, nothing changes
    ("TB.CONSUME", "e", "-1", "5"),
    ("TB.CONSUME", "e", "1e1000", "5"),
    ("TB.CONSUME", "e", "1e-13", "5"),
    ("TB.CONSUME", "e", "1e39", "5"),
    ("TB.CONSUME", "e", "1234567890123456789012345678901", "5"),
    ("TB.CONSUME", "e", "1/x", "5"),
    ("TB.CONSUME", "e", "/m", "5"),
    ("TB.CONSUME", "e", ".", "5"),
    ("TB.CONSUME", "e", "1", "9007199254740993"),
    ("TB.CONSUME", "e", "1", "5", "-1"),
    ("TB.CONSUME", "e", "1", "5", "FROB"),
    ("TB.CONSUME", "e", "1", "5", "1", "FROB"),
    ("TB.CONSUME", "e", "1", "5", "ATMOST", "ATMOST"),
    ("TB.CONSUME", "e", "1", "5", "1", "ATMOST", "RESERVE", "5"),
    ("TB.CONSUME", "e", "1", "5", "1", "RESERVE", "86400001"),
    ("TB.CONSUME", "e", "1", "5", "1", "RESERVE", "60001"),
    ("TB.CONSUME", "e", "1", "5", "1", "RESERVE"),
    ("TB.REFUND", "e", "x"),
    ("TB.INFO", "e"),
]


def test_fresh_sequence_agrees(pair: Pair) -> None:
    for step in FRESH_SEQUENCE:
        pair.same(call(*step), step)
        pair.same(info_without_clock(step[1] if step[0] != "TB.MCONSUME" else step[2]), step)
    for key in ["q", "slow", "fresh", "{t}a", "{t}b", "e"]:
        m, lua = pair.expire_times(key)
        assert (m < 0) == (lua < 0), key


def test_wrongtype_agrees(pair: Pair) -> None:
    for r in pair.raw:
        r.set("s", "x")
    for step in [("TB.CONSUME", "s", "1", "5"), ("TB.REFUND", "s", "1"), ("TB.INFO", "s"),
                 ("TB.MCONSUME", "2", "ok", "s", "1", "5", "1", "1", "5", "1")]:
        reply = pair.same(call(*step))
        assert str(reply).startswith("error: WRONGTYPE")
    assert pair.same(lambda lim: lim.client.exists("ok")) == 0, "an error changes nothing"


def frozen_steps(future_us: int) -> list[tuple[tuple[Any, ...], tuple[int, Fraction, int] | None]]:
    """(call, state to store first) pairs at fast and odd rates."""
    r = Fraction
    return [
        (("TB.CONSUME", "k", "10", "5", "1"), (0, r(10), 5)),
        (("TB.CONSUME", "k", "10", "5", "1", "RESERVE", "1000"), None),
        (("TB.CONSUME", "k", "10", "5", "1", "RESERVE", "1000"), None),
        (("TB.CONSUME", "k", "10", "5", "20", "RESERVE", "1000"), None),
        (("TB.CONSUME", "k", "10", "5", "0"), None),
        (("TB.REFUND", "k", "1"), None),
        (("TB.CONSUME", "k", "3", "3", "1"), (0, r(3), 3)),  # 334 ms: rounded up
        (("TB.CONSUME", "k", "100/m", "7", "2"), (1_500_000_000, r(5, 3), 7)),
        (("TB.CONSUME", "k", "100/m", "7", "5", "ATMOST"), None),
        (("TB.CONSUME", "k", "100/m", "7", "5", "ATMOST"), None),
        (("TB.CONSUME", "k", "1e12", str(MAX_AMOUNT), str(MAX_AMOUNT)), (12_345, r(10**12), MAX_AMOUNT)),
        (("TB.CONSUME", "k", "1e12", str(MAX_AMOUNT), "1", "ATMOST"), None),
        (("TB.CONSUME", "k", "9e15", str(MAX_AMOUNT), "3", "RESERVE", "60000"), (1, r(9 * 10**15), MAX_AMOUNT)),
        (("TB.CONSUME", "k", "1e-12", str(MAX_AMOUNT), "1"), (0, r(1, 10**12), MAX_AMOUNT)),
        (("TB.CONSUME", "k", "0.000000000001", str(MAX_AMOUNT), "0"), None),
        (("TB.CONSUME", "k", "7/d", "1000", "999", "RESERVE", "60000"), (998 * NANOS + 999_999_999, r(7, 86400), 1000)),
        (("TB.CONSUME", "k", "7/h", "10", "1"), (-3 * NANOS - 1, r(7, 3600), 10)),  # in debt
        (("TB.CONSUME", "k", "1", "10", "1"), None),  # rate switch while in debt
        (("TB.REFUND", "k", "2"), None),
        (("TB.CONSUME", "k", "2.5e9", "1000000000000", "999999999999"), (999_999_999_999 * NANOS - 1, r(25 * 10**8), 10**12)),
        (("TB.CONSUME", "k", "1", "5", "1"), (5 * NANOS - 1, r(1), 5)),
        (("TB.REFUND", "k", "0"), None),
    ]


def test_frozen_timeline_agrees(pair: Pair) -> None:
    future = pair.time_us() + 3600 * 1_000_000
    for step, state in frozen_steps(future):
        if state is not None:
            nanos, rate, cap = state
            pair.set_state("k", nanos, future, rate, cap)
        pair.same(call(*step), step)
        pair.same(info_without_clock("k"), step)
        m_exp, lua_exp = pair.expire_times("k")
        assert m_exp == lua_exp, step


RATES = st.one_of(
    st.sampled_from(["0", "1", "10", "0.5", "3", "7", "100/m", "1/h", "7/d", "1e-12", "3e-12",
                     "1e-3", "2.5e9", "1e12", "9e15", "123.456789", "1/d", "0.001/d"]),
    st.builds(lambda m, e: f"{m}e{e}", st.integers(1, 9_999_999), st.integers(-12, 8)),
)
CAPACITIES = st.one_of(st.integers(0, 20), st.integers(0, MAX_AMOUNT), st.just(MAX_AMOUNT), st.just(10**12))


def valid_rate(rate: str) -> bool:
    f = exact_rate(rate)
    return f == 0 or (f.numerator <= MAX_AMOUNT and f.denominator <= 2**40)


@st.composite
def frozen_case(draw: st.DrawFn) -> tuple[Any, ...]:
    stored_rate = draw(RATES.filter(valid_rate))
    cap = draw(CAPACITIES)
    # Debt stays within 2^53 tokens in all (the script's documented range).
    low = -(MAX_AMOUNT - cap) * NANOS
    nanos = draw(st.one_of(st.integers(max(low, -10 * NANOS), cap * NANOS),
                           st.integers(low, cap * NANOS), st.just(cap * NANOS)))
    same_limits = draw(st.booleans())
    rate = stored_rate if same_limits else draw(RATES)
    req_cap = cap if same_limits else draw(CAPACITIES)
    n = draw(st.one_of(st.integers(0, 3), st.integers(0, max(req_cap, 1)), st.just(req_cap + 1), st.just(MAX_AMOUNT)))
    mode = draw(st.sampled_from([(), ("ATMOST",), ("RESERVE", "0"), ("RESERVE", "1000"), ("RESERVE", "60000")]))
    kind = draw(st.sampled_from(["consume", "consume", "consume", "refund", "mconsume"]))
    return stored_rate, cap, nanos, rate, req_cap, n, mode, kind


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=frozen_case())
def test_random_frozen_states_agree(pair: Pair, case: tuple[Any, ...]) -> None:
    stored_rate, cap, nanos, rate, req_cap, n, mode, kind = case
    future = pair.time_us() + 3600 * 1_000_000
    pair.set_state("{x}k", nanos, future, exact_rate(stored_rate), cap)
    if kind == "consume":
        pair.same(call("TB.CONSUME", "{x}k", rate, req_cap, n, *mode), case)
    elif kind == "refund":
        pair.same(call("TB.REFUND", "{x}k", n))
    else:
        pair.set_state("{x}j", cap * NANOS // 2, future, exact_rate(stored_rate), cap)
        opt = ("RESERVE", mode[1]) if mode[:1] == ("RESERVE",) else ()
        pair.same(call("TB.MCONSUME", 2, "{x}k", "{x}j", rate, req_cap, n, stored_rate, cap, 1, *opt))
        pair.same(info_without_clock("{x}j"), case)
        assert pair.expire_times("{x}j")[0] == pair.expire_times("{x}j")[1]
    pair.same(info_without_clock("{x}k"), case)
    m_exp, lua_exp = pair.expire_times("{x}k")
    assert m_exp == lua_exp


def settle(nanos: int, elapsed_us: int, rate: Fraction, cap: int) -> int:
    """bucket.rs Bucket::settle, in Python integers."""
    if nanos >= cap * NANOS:
        return nanos
    add = elapsed_us * rate.numerator * 1000 // rate.denominator
    return min(cap * NANOS, nanos + add)


def test_refill_from_the_past_agrees(pair: Pair) -> None:
    """Long, exactly computed refills: elapsed days to years at slow rates,
    with products far beyond 2^53 (the script's bignum path)."""
    rng = random.Random(20251121)
    checked = 0
    for attempt in range(120):
        if attempt % 4 == 0:
            # Fast enough to fill the bucket in the time elapsed: stable at capacity.
            rate = f"{rng.randint(1, 10**6)}e-{rng.randint(3, 6)}"
        else:
            # At most about one nano-token a second: a partial refill that
            # cannot change during the few milliseconds of the calls.
            # (Units keep the denominator within the module's 2^40.)
            rate = f"{rng.randint(1, 1000)}" + rng.choice(["e-12", "e-9/m", "e-8/h", "e-6/d"])
        exact = exact_rate(rate)
        if exact.denominator > 2**40:
            continue
        cap = rng.choice([10, 10**6, 10**12, MAX_AMOUNT])
        nanos = rng.randint(-(10**12), cap * NANOS // 2)
        ago_us = rng.randint(86_400 * 10**6, 3 * 365 * 86_400 * 10**6)
        before = pair.time_us()
        lo = before // 1000 * 1000  # the module on Redis 7.0 reads a ms clock
        updated = before - ago_us
        pair.set_state("p", nanos, updated, exact, cap)
        n = rng.choice([1, 2, cap])
        # TB.INFO reads the settled bucket without writing; then one consume.
        infos = pair.both(info_without_clock("p"))
        replies = pair.both(call("TB.CONSUME", "p", rate, cap, n))
        hi = pair.time_us() + 1000
        if settle(nanos, lo - updated, exact, cap) != settle(nanos, hi - updated, exact, cap):
            continue  # the refill crossed a nano-token during the calls: not a controlled case
        assert agree(replies[0], replies[1]), (rate, cap, nanos, ago_us, n, replies)
        assert agree(infos[0], infos[1]), (rate, cap, nanos, ago_us, n, infos)
        checked += 1
        if checked == 60:
            break
    assert checked == 60, f"only {checked} cases had a stable refill"
