"""The module and the Lua fallback agree reply for reply, on a controlled clock.

Both servers run under the clockshift shim (tests/clockshift/clockshift.c at
the repository root) and read one control file, which freezes their wall
clock at the same instant; the tests move that instant forwards and back
between calls. So every reply, every TB.INFO field (``updated_at_ms`` and
``ttl_ms`` included) and every key's expiry is compared exactly, at any rate,
across clock steps, with states stored in the past or in the future.

On Redis 7.0 the module reads a millisecond clock while a script reads
``TIME`` in microseconds: there the clock is only ever frozen on whole
milliseconds, where both agree.
"""

from __future__ import annotations

import json
import os
import random
import struct
import tempfile
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import redis
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tbserver import REPO, Server, clockshift_env
from tb_limiter import Limiter

NANOS = 10**9
MAX_AMOUNT = 2**53
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
SEC = 1_000_000
# Where the frozen clock starts (2026-11-22), in microseconds.
T0 = 1_795_300_000 * SEC


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


class Clock:
    """The shim's control file: a seqlock word, a mode (0 shift, 1 frozen)
    and a value in microseconds, native-endian int64s."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.seq = 0
        with open(path, "wb") as f:
            f.write(struct.pack("=qqq", 0, 1, T0))

    def freeze(self, at_us: int) -> None:
        with open(self.path, "r+b") as f:
            f.write(struct.pack("=q", self.seq + 1))
            f.flush()
            f.write(struct.pack("=qq", 1, at_us))
            f.flush()
            self.seq += 2
            f.seek(0)
            f.write(struct.pack("=q", self.seq))


@pytest.fixture(scope="module")
def clocked() -> Iterator[tuple[Server, Server, Clock]]:
    """A server with the module and one without, one frozen clock for both.

    Active expiry is off on both: on a frozen clock it deletes a key whose
    expiry is the current millisecond (Redis 8.2 expires at ``now >= t``)
    while a lookup keeps it (``now > t``), at moments set by the real time of
    its cycle, so the two servers could hold different keys. Lookups alone
    expire keys the same way on both."""
    with tempfile.TemporaryDirectory(prefix="tb-clock-") as d:
        clock = Clock(os.path.join(d, "clock"))
        env = clockshift_env(clock.path)
        debug = ["--enable-debug-command", "local"]
        m = Server(with_module=True, env=env, extra=debug)
        try:
            p = Server(with_module=False, env=env, extra=debug)
        except BaseException:
            m.stop()
            raise
        try:
            for s in (m, p):
                s.command("DEBUG", "SET-ACTIVE-EXPIRE", 0)
            yield m, p, clock
        finally:
            m.stop()
            p.stop()


class Pair:
    """The same database on both backends and one clock: a call goes to both
    and returns both answers (a reply, or the error text)."""

    def __init__(self, module_server: Server, plain_server: Server, clock: Clock) -> None:
        self.servers = (module_server, plain_server)
        self.clock = clock
        self.raw = tuple(s.client() for s in self.servers)
        self.limiters = (Limiter.from_url(module_server.url, backend="module"), Limiter.from_url(plain_server.url, backend="lua"))
        assert [lim.backend for lim in self.limiters] == ["module", "lua"]
        for r in self.raw:
            r.flushall()
        self.micros = True
        self.micros = self._module_reads_microseconds()
        self.at(T0)

    def _module_reads_microseconds(self) -> bool:
        """Whether the module's clock has microseconds (Redis 7.2+)."""
        self.clock.freeze(T0 + 500)
        m = self.raw[0]
        m.execute_command("TB.SETSTATE", "probe", 0, T0, 1, 1, 1, 0)
        tokens = dict(zip(*[iter(m.execute_command("TB.INFO", "probe"))] * 2))[b"tokens"]
        m.delete("probe")
        return bool(tokens == b"0.0005")

    def at(self, t_us: int) -> None:
        """Freezes both servers' clock at ``t_us`` (a whole millisecond when
        the module only reads milliseconds)."""
        if not self.micros:
            t_us -= t_us % 1000
        self.now = t_us
        self.clock.freeze(t_us)

    def step(self, delta_us: int) -> None:
        self.at(self.now + delta_us)

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
        assert agree(m, lua), f"{what} at {self.now}: module {m!r} != lua {lua!r}"
        return m

    def keys_agree(self, *keys: str, what: object = "") -> None:
        """TB.INFO (every field) and the key's absolute expiry are equal."""
        for k in keys:
            self.same(info(k), (what, k))
            m_exp, lua_exp = self.expire_times(k)
            assert m_exp == lua_exp, (what, k, m_exp, lua_exp)

    def set_state(self, key: str, nanos: int, updated_us: int, rate: Fraction, capacity: int) -> None:
        """Stores the same bucket on both: TB.SETSTATE on the module, the
        script's hash fields on the other (no expiry on either)."""
        m, lua = self.raw
        m.execute_command("TB.SETSTATE", key, nanos, updated_us, rate.numerator, rate.denominator, capacity, 0)
        w, f = divmod(nanos, NANOS)
        lua.delete(key)
        lua.hset(key, mapping={"w": w, "f": f, "t": updated_us, "rn": rate.numerator, "rd": rate.denominator,
                               "c": capacity})

    def expire_times(self, key: str) -> tuple[int, int]:
        """Absolute expiry in ms of the key on both (-1 none, -2 missing)."""
        return tuple(int(r.execute_command("PEXPIRETIME", key)) for r in self.raw)  # type: ignore[return-value]


@pytest.fixture
def pair(clocked: tuple[Server, Server, Clock]) -> Pair:
    return Pair(*clocked)


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


def info(key: str) -> Callable[[Limiter], Any]:
    """TB.INFO as a dict (None for a missing key)."""

    def run(lim: Limiter) -> Any:
        reply = call("TB.INFO", key)(lim)
        return None if reply is None else dict(zip(reply[0::2], reply[1::2]))

    return run


# A shared sequence, with the clock moving (microseconds) before some calls.
SEQUENCE: list[tuple[int, tuple[Any, ...]]] = [
    (0, ("TB.CONSUME", "q", "0", "5")),
    (0, ("TB.CONSUME", "q", "0", "5", "3")),
    (0, ("TB.CONSUME", "q", "0", "5", "2")),  # 1 left: never (rate 0)
    (0, ("TB.CONSUME", "q", "0", "5", "6")),  # above capacity: never
    (0, ("TB.CONSUME", "q", "0", "5", "0")),  # peek: one token is there
    (0, ("TB.CONSUME", "q", "0", "5", "4", "ATMOST")),
    (0, ("TB.CONSUME", "q", "0", "5", "1", "ATMOST")),
    (0, ("TB.CONSUME", "q", "0", "5", "0")),  # peek on an empty fixed budget: never
    (0, ("TB.REFUND", "q", "2")),
    (0, ("TB.CONSUME", "q", "0", "7", "2")),  # capacity change
    (0, ("TB.REFUND", "q", "100")),
    (0, ("TB.REFUND", "missing", "1")),
    (0, ("TB.INFO", "missing")),
    # The peek on an empty bucket: denied, with the wait for one token.
    (0, ("TB.CONSUME", "p", "0.001", "3", "3")),
    (0, ("TB.CONSUME", "p", "0.001", "3", "0")),
    (0, ("TB.CONSUME", "p", "0.001", "3", "1")),
    (999 * SEC, ("TB.CONSUME", "p", "0.001", "3", "0")),
    (SEC, ("TB.CONSUME", "p", "0.001", "3", "0")),
    (0, ("TB.CONSUME", "z", "1", "0", "0")),  # capacity 0: a peek is never served
    (0, ("TB.CONSUME", "k", "10", "5", "1")),
    (0, ("TB.CONSUME", "k", "10", "5", "4", "RESERVE", "1000")),
    (0, ("TB.CONSUME", "k", "10", "5", "3", "RESERVE", "1000")),  # queued behind the debt
    (0, ("TB.CONSUME", "k", "10", "5", "20", "RESERVE", "1000")),
    (0, ("TB.CONSUME", "k", "10", "5", "0")),
    (150_000, ("TB.CONSUME", "k", "10", "5", "0")),
    (200_000, ("TB.CONSUME", "k", "10", "5", "1")),
    (-20 * SEC, ("TB.CONSUME", "k", "10", "5", "1")),  # a step back: waits count it
    (0, ("TB.CONSUME", "k", "10", "5", "1", "RESERVE", "20100")),
    (0, ("TB.MCONSUME", "2", "k", "k2", "10", "5", "1", "1", "1", "1")),
    (20 * SEC, ("TB.CONSUME", "k", "10", "5", "1")),
    (1_000, ("TB.CONSUME", "k", "3", "3", "1")),  # rate change: 334 ms rounded up
    (333_000, ("TB.CONSUME", "k", "3", "3", "1")),
    (1_000, ("TB.CONSUME", "k", "3", "3", "1")),
    (0, ("TB.CONSUME", "k", "100/m", "7", "2")),
    (3_000, ("TB.CONSUME", "k", "100/m", "7", "5", "ATMOST")),
    (0, ("TB.CONSUME", "slow", "1e-12", "10", "4")),
    (0, ("TB.CONSUME", "slow", "1e-12", "10", "7")),
    (0, ("TB.CONSUME", "slow", "1e-12", "10", "7", "RESERVE", "60000")),
    (0, ("TB.CONSUME", "slow", "1e-12", "10", "7", "ATMOST")),
    (0, ("TB.CONSUME", "slow", "1e-12", "10", "0")),
    (0, ("TB.CONSUME", "slow", "2e-12", "10", "1")),  # rate change
    (0, ("TB.CONSUME", "slow", "2e-12", "10", "11")),
    (0, ("TB.CONSUME", "big", "9e15", str(MAX_AMOUNT), str(MAX_AMOUNT))),
    (1, ("TB.CONSUME", "big", "9e15", str(MAX_AMOUNT), "3", "RESERVE", "60000")),
    (0, ("TB.CONSUME", "big", "1e-12", str(MAX_AMOUNT), "0")),
    (0, ("TB.MCONSUME", "2", "{t}a", "{t}b", "0", "3", "1", "1e-12", "1000", "600")),
    (0, ("TB.MCONSUME", "2", "{t}a", "{t}b", "0", "3", "1", "1e-12", "1000", "600")),
    (0, ("TB.MCONSUME", "2", "{t}a", "{t}b", "0", "3", "1", "1e-12", "1000", "400")),
    (0, ("TB.MCONSUME", "2", "{t}a", "{t}b", "0", "3", "9", "1e-12", "1000", "1")),
    (0, ("TB.MCONSUME", "2", "{t}a", "{t}b", "0", "3", "1", "1e-12", "1000", "1", "RESERVE", "60000")),
    (0, ("TB.MCONSUME", "2", "{t}a", "{t}b", "0", "3", "0", "1e-12", "1000", "0")),  # peeks
    (0, ("TB.MCONSUME", "1", "{t}c", "1e-12", "0", "0")),
    # ATMOST MIN chunk: a chunk or nothing, and the wait for the chunk.
    (0, ("TB.CONSUME", "m", "10", "100", "100")),
    (0, ("TB.CONSUME", "m", "10", "100", "50", "ATMOST", "MIN", "20")),
    (1_500_000, ("TB.CONSUME", "m", "10", "100", "50", "ATMOST", "MIN", "20")),
    (500_000, ("TB.CONSUME", "m", "10", "100", "50", "ATMOST", "MIN", "20")),
    (0, ("TB.CONSUME", "m", "10", "100", "3", "min", "20", "atmost")),  # chunk > n: all of n
    (700_000, ("TB.CONSUME", "m", "10", "100", "500", "ATMOST", "MIN", "100")),
    (0, ("TB.CONSUME", "m", "0", "100", "50", "ATMOST", "MIN", "20")),  # rate 0: never
    (0, ("TB.CONSUME", "m", "10", "100", "0", "ATMOST", "MIN", "20")),  # peek
    (0, ("TB.MCONSUME", "3", "{s}u", "{s}g", "{s}r", "10", "100", "60", "5", "30", "60", "1", "10", "1",
         "ATMOST", "MIN", "20")),
    (0, ("TB.MCONSUME", "3", "{s}u", "{s}g", "{s}r", "10", "100", "60", "5", "30", "60", "1", "10", "1",
         "ATMOST", "MIN", "20")),
    (2_000_000, ("TB.MCONSUME", "3", "{s}u", "{s}g", "{s}r", "10", "100", "60", "5", "30", "60", "1", "10", "1",
                 "ATMOST", "MIN", "20")),
    (4_000_000, ("TB.MCONSUME", "3", "{s}u", "{s}g", "{s}r", "10", "100", "60", "5", "30", "60", "1", "10", "1",
                 "atmost")),
    (0, ("TB.MCONSUME", "2", "{s}u", "{s}g", "10", "100", "0", "5", "30", "0", "ATMOST")),  # peeks
    (0, ("TB.MCONSUME", "2", "{s}u", "{s}z", "10", "100", "9", "0", "30", "9", "ATMOST")),
    (0, ("TB.MCONSUME", "2", "{s}u", "{s}z", "10", "100", "9", "1", "0", "9", "ATMOST")),  # capacity 0: never
    (0, ("TB.CONSUME", "m", "10", "100", "5", "ATMOST", "MIN", "0")),
    (0, ("TB.MCONSUME", "2", "{s}u", "{s}g", "10", "100", "60", "5", "30", "60", "ATMOST", "MIN", "31")),
    (0, ("TB.MCONSUME", "2", "{s}u", "{s}g", "10", "100", "60", "5", "30", "6", "ATMOST", "MIN", "31")),
    (0, ("TB.MCONSUME", "1", "{s}u", "10", "100", "60", "ATMOST", "MIN")),
    (0, ("TB.MCONSUME", "1", "{s}u", "10", "100", "60", "ATMOST", "RESERVE", "5")),
    # Every spelling of a rate in range, the same fraction.
    (0, ("TB.CONSUME", "r1", "1e0001", "20", "1")),
    (0, ("TB.CONSUME", "r1", "10", "20", "1")),
    (0, ("TB.CONSUME", "r2", "1000000000000000000000000000000e-30", "20", "1")),
    (0, ("TB.CONSUME", "r2", "1", "20", "1")),
    (0, ("TB.CONSUME", "r3", "8191.99999999999909050529822707176208496093750000", "9", "1")),
    (0, ("TB.CONSUME", "r4", "0." + "0" * 100_000 + "1e100001", "9", "1")),
    (0, ("TB.CONSUME", "r5", "5e-0000000000000000000000000000003/d", "9", "1")),
    (0, ("TB.CONSUME", "r6", "0e99999999999999999999999999", "9", "1")),
    # Wrong arity: Redis' own error, which the script spells the same.
    (0, ("TB.REFUND", "e")),
    (0, ("TB.CONSUME", "e", "1")),
]


def test_sequence_agrees(pair: Pair) -> None:
    for delta, step in SEQUENCE:
        pair.step(delta)
        pair.same(call(*step), step)
        keys = step[2 : 2 + int(step[1])] if step[0] == "TB.MCONSUME" else step[1:2]
        pair.keys_agree(*keys, what=step)


# Leases (issue 13): lent tokens, released once, settled to the tokens used,
# expired lazily; the clock moves (microseconds) before some calls. "$x"
# stands for the lease id a step saved as "x": the last element of its
# reply, or with "x:j" the lease id of TB.MCONSUME's part j. Lease ids are
# random, each backend's own: replies agree with ids compared as "0 or not",
# every id handed out is new, and each backend's later steps use its own ids.
LEASE_SEQUENCE: list[tuple[int, str, tuple[str, ...]]] = [
    (0, "a", ("TB.CONSUME", "in", "0", "2", "1", "LEASE", "1000")),
    (1, "b", ("TB.CONSUME", "in", "0", "2", "1", "LEASE", "2000")),
    (0, "", ("TB.CONSUME", "in", "0", "2", "1", "LEASE", "1000")),  # denied: the wait for the first expiry
    (0, "", ("TB.CONSUME", "in", "0", "2", "0")),  # a peek counts the leases too
    (0, "", ("TB.CONSUME", "in", "0", "2", "2")),
    (0, "", ("TB.CONSUME", "in", "0", "2", "3")),  # above capacity: never
    (0, "", ("TB.RELEASE", "in", "$a")),
    (0, "", ("TB.RELEASE", "in", "$a")),  # a second release: nil, nothing changes
    (0, "", ("TB.RELEASE", "in", "0")),
    (0, "", ("TB.RELEASE", "missing", "5")),
    (999_999, "c", ("TB.CONSUME", "in", "0", "2", "1", "LEASE", "500")),
    (1_000_000, "", ("TB.CONSUME", "in", "0", "2", "1", "LEASE", "500")),  # b and c expired
    (0, "", ("TB.REFUND", "in", "1")),
    (0, "", ("TB.RELEASE", "in", "$b")),  # expired: nil
    (600_000, "", ("TB.INFO", "in")),
    (0, "", ("TB.CONSUME", "in", "0", "2", "1")),  # a plain take on a bucket with leases
    (3 * SEC, "", ("TB.CONSUME", "in", "0", "2", "1", "LEASE", "1")),
    (1_000, "", ("TB.INFO", "in")),
    # Settling: a token bucket, an estimate lent, the use charged or refunded.
    (0, "t1", ("TB.CONSUME", "tpm", "100", "1000", "400", "LEASE", "60000")),
    (0, "t2", ("TB.CONSUME", "tpm", "100", "1000", "500", "LEASE", "60000")),
    (10_000, "", ("TB.RELEASE", "tpm", "$t1", "USED", "900")),  # into debt
    (0, "", ("TB.CONSUME", "tpm", "100", "1000", "200")),
    (0, "", ("TB.RELEASE", "tpm", "$t2", "USED", "100")),
    (0, "", ("TB.RELEASE", "tpm", "$t2", "USED", "100")),  # a retried settle: nil, applied once
    (0, "", ("TB.CONSUME", "tpm", "100", "1000", "100", "RESERVE", "5000")),
    (0, "", ("TB.INFO", "tpm")),
    # In one call: requests, tokens and in-flight; the in-flight part leased.
    (0, "i:2", ("TB.MCONSUME", "3", "{u}r", "{u}t", "{u}i", "60/m", "60", "1", "1000/m", "1000", "300", "0", "1", "1",
              "LEASE", "3", "30000", "LEASE", "2", "30000")),
    (0, "", ("TB.MCONSUME", "3", "{u}r", "{u}t", "{u}i", "60/m", "60", "1", "1000/m", "1000", "300", "0", "1", "1",
             "LEASE", "3", "30000", "RESERVE", "10000")),  # the leased part is short: denied, its wait
    (0, "", ("TB.MCONSUME", "2", "{u}r", "{u}t", "60/m", "60", "1", "1000/m", "1000", "900", "RESERVE", "60000")),
    (0, "", ("TB.MCONSUME", "2", "{u}r", "{u}i", "60/m", "60", "1", "0", "1", "1")),  # no lease here, the wait counts it
    (5 * SEC, "", ("TB.MCONSUME", "2", "{u}t", "{u}i", "1000/m", "1000", "1", "0", "1", "1", "LEASE", "2", "100")),
    (0, "", ("TB.RELEASE", "{u}t", "$i", "USED", "250")),
    (30 * SEC, "", ("TB.MCONSUME", "2", "{u}t", "{u}i", "1000/m", "1000", "1", "0", "1", "1", "LEASE", "2", "100")),
    (0, "", ("TB.INFO", "{u}i")),
    (100 * SEC, "", ("TB.INFO", "{u}t")),
    # The leased part available now, the other one reserved: granted, with
    # the wait for the reservation.
    (0, "", ("TB.CONSUME", "{u}t", "1000/m", "1000", "800")),
    (0, "r", ("TB.MCONSUME", "2", "{u}t", "{u}i", "1000/m", "1000", "900", "0", "1", "1", "LEASE", "2", "5000",
              "RESERVE", "60000")),
    (0, "", ("TB.INFO", "{u}i")),
    # KEEP (issue 18): an estimate's tokens stay used at its expiry, a
    # slot's come back; both in one call too.
    (0, "k", ("TB.CONSUME", "keep", "1", "10", "6", "LEASE", "1000", "KEEP")),
    (0, "", ("TB.CONSUME", "keep", "1", "10", "4", "LEASE", "1000")),
    (0, "", ("TB.CONSUME", "keep", "1", "10", "1")),  # denied: the slot's expiry, not the estimate's
    (0, "", ("TB.INFO", "keep")),
    (1_000_000, "", ("TB.INFO", "keep")),  # both expired: 4 back, 6 still used
    (0, "", ("TB.RELEASE", "keep", "$k")),  # expired: nil
    (0, "m", ("TB.MCONSUME", "2", "{k}a", "{k}b", "0", "5", "2", "1", "10", "3",
              "LEASE", "1", "500", "LEASE", "2", "500", "keep")),
    (0, "", ("TB.RELEASE", "{k}b", "$m", "USED", "1")),  # a kept lease released early: 2 back
    (600_000, "", ("TB.MCONSUME", "2", "{k}a", "{k}b", "0", "5", "0", "1", "10", "0")),
    # What went back: 1 of 4 when a refund filled the bucket meanwhile, 0
    # when it was full.
    (0, "f", ("TB.CONSUME", "full", "0", "10", "4", "LEASE", "60000")),
    (0, "", ("TB.REFUND", "full", "3")),
    (0, "", ("TB.RELEASE", "full", "$f")),
    (0, "g", ("TB.CONSUME", "full", "0", "10", "4", "LEASE", "60000")),
    (0, "", ("TB.REFUND", "full", "4")),
    (0, "", ("TB.RELEASE", "full", "$g", "USED", "1")),
]



def lease_id_slots(step: tuple[str, ...], reply: Any) -> list[int]:
    """Where the lease ids are in the reply to ``step``."""
    if not isinstance(reply, list) or "LEASE" not in (a.upper() for a in step):
        return []
    if step[0] == "TB.CONSUME":
        return [5]
    k = int(step[1])
    return list(range(len(reply) - k, len(reply)))


def test_leases_agree(pair: Pair) -> None:
    ids: tuple[dict[str, str], dict[str, str]] = ({}, {})
    seen: tuple[set[int], set[int]] = (set(), set())
    for delta, save, raw_step in LEASE_SEQUENCE:
        pair.step(delta)
        replies, masked = [], []
        for b, lim in enumerate(pair.limiters):
            step = tuple(ids[b][a[1:]] if a.startswith("$") else a for a in raw_step)
            try:
                reply = call(*step)(lim)
            except redis.ResponseError as e:
                reply = f"error: {e}"
            replies.append(reply)
            slots = lease_id_slots(raw_step, reply)
            shown = list(reply) if slots else reply
            for at in slots:
                lease_id = reply[at]
                if lease_id != 0:
                    assert 1 <= lease_id < 2**53 and lease_id not in seen[b], (raw_step, b, reply)
                    seen[b].add(lease_id)
                    shown[at] = "id"
            masked.append(shown)
            if save:
                assert isinstance(reply, list) and reply[0] == 1, (step, reply)
                name, _, part = save.partition(":")
                ids[b][name] = str(reply[-1] if not part else reply[len(reply) - int(step[1]) + int(part) - 1])
        assert agree(masked[0], masked[1]), f"{raw_step} at {pair.now}: module {replies[0]!r} != lua {replies[1]!r}"
        keys = raw_step[2 : 2 + int(raw_step[1])] if raw_step[0] == "TB.MCONSUME" else raw_step[1:2]
        pair.keys_agree(*keys, what=raw_step)


def test_a_full_lease_table_agrees(pair: Pair) -> None:
    """The 1025th lease on one bucket is refused by both and changes nothing;
    a plain take still works."""
    for lim in pair.limiters:
        for _ in range(1024):
            assert call("TB.CONSUME", "lf", "0", "2000", "1", "LEASE", "60000")(lim)[0] == 1
    pair.keys_agree("lf")
    full = pair.same(call("TB.CONSUME", "lf", "0", "2000", "1", "LEASE", "60000"))
    assert full == "error: the bucket holds 1024 leases already: release some or wait for them to expire"
    pair.same(call("TB.MCONSUME", "1", "lf", "0", "2000", "1", "LEASE", "1", "5"))
    pair.keys_agree("lf")
    pair.same(call("TB.CONSUME", "lf", "0", "2000", "1"))
    pair.keys_agree("lf")


def test_wrongtype_agrees(pair: Pair) -> None:
    for r in pair.raw:
        r.set("s", "x")
    for step in [("TB.CONSUME", "s", "1", "5"), ("TB.REFUND", "s", "1"), ("TB.INFO", "s"),
                 ("TB.MCONSUME", "2", "ok", "s", "1", "5", "1", "1", "5", "1")]:
        reply = pair.same(call(*step))
        assert str(reply).startswith("error: WRONGTYPE")
    assert pair.same(lambda lim: lim.client.exists("ok")) == 0, "an error changes nothing"


def test_exact_on_time_agrees(pair: Pair) -> None:
    """No write loses a fraction: 15 reservations a millisecond apart at 1/3
    token/s, then exactly 73 tokens are there at 264 s (not 72.999999995),
    and a request for them, made exactly then, is served."""
    pair.same(call("TB.CONSUME", "x", "20/m", "200", "200"))
    start = pair.now
    for _ in range(15):
        pair.step(1000)
        pair.same(call("TB.CONSUME", "x", "20/m", "200", "1", "RESERVE", "60000"))
    pair.at(start + 264 * SEC - 1000)
    assert pair.same(call("TB.CONSUME", "x", "20/m", "200", "73"))[:3] == [0, 72, 1]
    pair.at(start + 264 * SEC)
    assert pair.same(info("x"))["tokens"] == "73"
    assert pair.same(call("TB.CONSUME", "x", "20/m", "200", "73")) == [1, 0, 0, 600_000, 73]


def test_clock_steps_agree(pair: Pair) -> None:
    """The issue's clock step: waits after a step back include the time
    until the clock passes the stored time, for every command."""
    pair.same(call("TB.CONSUME", "s", "1", "10", "10"))
    pair.keys_agree("s")
    for delta in [-20 * SEC, -1, 0, 19 * SEC, SEC - 1, 2, -3600 * SEC, 3600 * SEC + 4 * SEC]:
        pair.step(delta)
        assert pair.same(call("TB.CONSUME", "s", "1", "10", "0"))[0] in (0, 1)
        pair.same(call("TB.CONSUME", "s", "1", "10", "1", "RESERVE", "30000"))
        pair.same(call("TB.MCONSUME", "1", "s", "1", "10", "2"))
        pair.same(call("TB.REFUND", "s", "1"))
        pair.keys_agree("s", what=delta)


RATES = st.one_of(
    st.sampled_from(["0", "1", "10", "0.5", "3", "7", "100/m", "1/h", "7/d", "1e-12", "3e-12", "20/m",
                     "1e-3", "2.5e9", "1e12", "9e15", "123.456789", "1/d", "0.001/d"]),
    st.builds(lambda m, e: f"{m}e{e}", st.integers(1, 9_999_999), st.integers(-12, 8)),
)
CAPACITIES = st.one_of(st.integers(0, 20), st.integers(0, MAX_AMOUNT), st.just(MAX_AMOUNT), st.just(10**12))
# Clock moves: none, microseconds to seconds either way, and days to years.
STEPS = st.one_of(st.just(0), st.integers(-2 * SEC, 5 * SEC), st.integers(-40 * SEC, 40 * SEC),
                  st.integers(-400 * 86400 * SEC, 3 * 365 * 86400 * SEC))
MODES = st.sampled_from([(), ("ATMOST",), ("RESERVE", "0"), ("RESERVE", "1000"), ("RESERVE", "60000")])
# ATMOST MIN chunk, with a chunk from 1 to the capacity (one above is an error).
CHUNKS = st.one_of(st.integers(1, 5), st.integers(1, MAX_AMOUNT))


def valid_rate(rate: str) -> bool:
    f = exact_rate(rate)
    return f == 0 or (f.numerator <= MAX_AMOUNT and f.denominator <= 2**40)


@st.composite
def stored_state(draw: st.DrawFn) -> tuple[str, int, int, int]:
    """(rate, capacity, nano-tokens, stored time relative to now): any valid
    state, in debt down to 2^53 tokens (the script's documented range), stored
    in the past or in the future (a clock that stepped back)."""
    rate = draw(RATES.filter(valid_rate))
    cap = draw(CAPACITIES)
    low = -(MAX_AMOUNT - cap) * NANOS
    nanos = draw(st.one_of(st.integers(max(low, -10 * NANOS), cap * NANOS),
                           st.integers(low, cap * NANOS), st.just(cap * NANOS)))
    return rate, cap, nanos, draw(STEPS)


@st.composite
def operation(draw: st.DrawFn) -> tuple[Any, ...]:
    kind = draw(st.sampled_from(["consume", "consume", "consume", "refund", "mconsume", "state"]))
    key = draw(st.sampled_from(["{x}a", "{x}b"]))
    if kind == "state":
        return ("state", key, draw(stored_state()))
    if kind == "refund":
        return ("TB.REFUND", key, draw(st.one_of(st.integers(0, 3), st.integers(0, MAX_AMOUNT))))
    rate, cap = draw(RATES), draw(CAPACITIES)
    n = draw(st.one_of(st.integers(0, 3), st.integers(0, max(cap, 1)), st.just(cap + 1), st.just(MAX_AMOUNT)))
    if kind == "mconsume":
        opt = draw(st.sampled_from([(), ("RESERVE", "0"), ("RESERVE", "1000"), ("RESERVE", "60000"), ("ATMOST",),
                                    ("ATMOST", "MIN")]))
        cap2 = draw(CAPACITIES)
        n2 = draw(st.one_of(st.integers(0, 3), st.just(n)))
        if opt == ("ATMOST", "MIN"):
            opt = ("ATMOST", "MIN", min(draw(CHUNKS), max(1, min(cap, cap2))))
        return ("TB.MCONSUME", 2, "{x}a", "{x}b", rate, cap, n, draw(RATES), cap2, n2, *opt)
    mode = draw(MODES)
    if mode == ("ATMOST",) and draw(st.booleans()):
        mode = ("ATMOST", "MIN", min(draw(CHUNKS), max(cap, 1)))
    return ("TB.CONSUME", key, rate, cap, n, *mode)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.tuples(STEPS, operation()), min_size=1, max_size=12))
def test_random_timelines_agree(pair: Pair, steps: list[tuple[int, tuple[Any, ...]]]) -> None:
    """Random states, calls and clock moves (forwards, standing still, back,
    by microseconds to years): every reply, every TB.INFO field and every
    expiry agree."""
    pair.at(T0)
    for r in pair.raw:
        r.flushall()
    for delta, op in steps:
        pair.step(delta)
        if op[0] == "state":
            rate, cap, nanos, updated = op[2]
            at = pair.now + updated
            if not pair.micros:
                at -= at % 1000
            pair.set_state(op[1], nanos, at, exact_rate(rate), cap)
        else:
            pair.same(call(*op), (delta, op))
            # A reservation can take a bucket past the script's documented
            # range (capacity plus debt within 2^53 tokens,
            # docs/lua-fallback.md); such a timeline is not compared.
            assume(all(in_script_range(pair.limiters[0], k) for k in ("{x}a", "{x}b")))
        pair.keys_agree("{x}a", "{x}b", what=(delta, op))


def in_script_range(module: Limiter, key: str) -> bool:
    """Whether the module's bucket at ``key`` (if any) has capacity plus
    debt within 2^53 tokens, where the script is exact."""
    i = info(key)(module)
    return i is None or Decimal(i["capacity"]) - Decimal(i["tokens"]) <= MAX_AMOUNT


def test_refill_from_the_past_agrees(pair: Pair) -> None:
    """Long, exact refills: states stored days to years ago at slow and fast
    rates, with products far beyond 2^53 (the script's bignum path)."""
    rng = random.Random(20251121)
    for _ in range(80):
        rate = rng.choice([f"{rng.randint(1, 10**6)}e-{rng.randint(3, 6)}",
                           f"{rng.randint(1, 1000)}" + rng.choice(["e-12", "e-9/m", "e-8/h", "e-6/d", "/d", "/m"])])
        exact = exact_rate(rate)
        if exact.denominator > 2**40:
            continue
        cap = rng.choice([10, 10**6, 10**12, MAX_AMOUNT])
        nanos = rng.randint(-(10**12), cap * NANOS // 2)
        pair.at(T0 + rng.randint(0, 10**9))
        updated = pair.now - rng.randint(86_400 * SEC, 3 * 365 * 86_400 * SEC)
        if not pair.micros:
            updated -= updated % 1000
        pair.set_state("p", nanos, updated, exact, cap)
        pair.keys_agree("p", what=(rate, cap, nanos, updated))
        pair.same(call("TB.CONSUME", "p", rate, cap, rng.choice([0, 1, 2, cap])), (rate, cap, nanos, updated))
        pair.keys_agree("p", what=(rate, cap, nanos, updated))



def test_paying_off_a_deep_debt_agrees(pair: Pair) -> None:
    """A debt near 2^52 tokens paid off by a refill of more than 2^53 whole
    tokens (the script once added them as a double, which rounded: one token
    more than the module; Node agreement seed 691539191)."""
    rate, cap = Fraction(229_619_000), 7_204_707_198_042_112
    pair.at(T0 + 10**9)
    for elapsed_us in (45_855_818_898_687, 40_000_000_000_001, 55_000_000_123_457):
        updated = pair.now - elapsed_us
        if not pair.micros:
            updated -= updated % 1000
        nanos = -6_808_748_215_169_021 * NANOS - 62_353_396
        assert rate * elapsed_us / 10**6 > 2**53, "the refill's whole tokens pass 2^53"
        pair.set_state("debt", nanos, updated, rate, cap)
        pair.keys_agree("debt", what=elapsed_us)
        pair.same(call("TB.CONSUME", "debt", "229619000", cap, 1), elapsed_us)
        pair.keys_agree("debt", what=elapsed_us)

# --------------------------------------------------------------------------
# Every error the module's Rust source can send is checked against the Lua
# fallback: the same text from both, or listed here as module-only.

_CATALOGUE: dict[str, Any] = json.loads((REPO / "protocol" / "catalogue.json").read_text())
#: Every error line the module can answer (src/errors.rs), by name, and its
#: limits, from the catalogue (protocol/catalogue.json, `make catalogue`).
ERRORS: dict[str, str] = _CATALOGUE["errors"]
LIMITS: dict[str, int] = _CATALOGUE["limits"]

# Errors of what the script does not implement (TB.CONFIG, TB.SETSTATE,
# CL.THROTTLE, TB.TOP, server-side waiting) and of the module's own failures.
MODULE_ONLY = {
    "ERR_STATE",
    "ERR_DELTA",
    "ERR_BURST",
    "ERR_COUNT",
    "ERR_PERIOD",
    "ERR_QUANTITY",
    "ERR_PANIC_NO_EFFECT",
    "ERR_PANIC_MAY_HAVE_EFFECTS",
    # Redis' own OOM error, which the module sends itself only when a script
    # flagged allow-oom would create a bucket past maxmemory.
    "ERR_OOM",
    "ERR_LOST_REPLY",
    # a call waiting for a lease had its arity checked when it came
    "ERR_WRONG_ARITY",
    "ERR_UNSENDABLE",  # an error text that cannot be sent as it is
    "ERR_UNBLOCKED",  # a failover while a call waits on the server
    # TB.CONFIG and the settings
    "ERR_MAX_BLOCKED",
    "ERR_MAX_WAIT",
    "ERR_UNKNOWN_SETTING",
    "ERR_SUBCOMMAND",
    "ERR_EXPIRE_IDLE",
    "ERR_TOP_KEYS",
    # TB.TOP
    "ERR_TOP_COUNT",
    "ERR_TOP_OPTION",
}

# A call of each shared error, by name, in module spelling, and the error line
# both must answer when it is not the catalogue's line as it is (a template
# filled as the call fills it; "in MULTI": the call is made in MULTI).
ERROR_CALLS: dict[str, tuple[tuple[Any, ...], str]] = {
    "ERR_RATE": (("TB.CONSUME", "e", "1e", "5"), ""),
    "ERR_RATE_RANGE": (("TB.MCONSUME", "1", "e", "1e-13", "5", "1"), ""),
    "ERR_CAPACITY": (("TB.CONSUME", "e", "1", "9007199254740993"), ""),
    "ERR_N": (("TB.REFUND", "e", "-1"), ""),
    "ERR_WAIT": (("TB.CONSUME", "e", "1", "5", "1", "BLOCK", "86400001"), ""),
    "ERR_WAIT_EXCEEDS": (("TB.MCONSUME", "1", "e", "1", "5", "1", "RESERVE", "60001"),
                         ERRORS["ERR_WAIT_EXCEEDS"].replace("{}", "60000")),
    "ERR_OPTION": (("TB.CONSUME", "e", "1", "5", "ATMOST", "ATMOST"), ""),
    "ERR_ATMOST_WAIT": (("TB.CONSUME", "e", "1", "5", "1", "BLOCK", "5", "ATMOST"), ""),
    "ERR_CANNOT_BLOCK": (("TB.CONSUME", "e", "1", "5", "1", "BLOCK", "5"), "in MULTI"),
    "ERR_NUMKEYS": (("TB.MCONSUME", "2", "e", "f", "1", "5", "1"), ""),
    "ERR_DUPLICATE": (("TB.MCONSUME", "2", "e", "e", "1", "5", "1", "1", "5", "1"), ""),
    "ERR_MCONSUME_OPTION": (("TB.MCONSUME", "1", "e", "1", "5", "1", "WAIT", "5"), ""),
    "ERR_MCONSUME_BLOCK": (("TB.MCONSUME", "1", "e", "1", "5", "1", "BLOCK", "5", "ATMOST"), ""),
    "ERR_FLOW_BLOCK": (("TB.CONSUME", "e", "1", "5", "1", "RESERVE", "5", "FLOW", "a"), ""),
    "ERR_FLOW_NAME": (("TB.MCONSUME", "1", "e", "1", "5", "1", "BLOCK", "5", "FLOW", "x" * (LIMITS["MAX_FLOW_NAME"] + 1)), ""),
    "ERR_WEIGHT": (("TB.CONSUME", "e", "1", "5", "BLOCK", "5", "FLOW", "a", "WEIGHT", str(LIMITS["MAX_WEIGHT"] + 1)), ""),
    "ERR_MIN": (("TB.CONSUME", "e", "1", "5", "9", "ATMOST", "MIN", "6"), ""),
    "ERR_MIN_ATMOST": (("TB.CONSUME", "e", "1", "5", "9", "MIN", "2"), ""),
    "ERR_WRONGTYPE": (("TB.INFO", "str"), ""),
    "ERR_LEASE_TTL": (("TB.CONSUME", "e", "1", "5", "LEASE", "0"), ""),
    "ERR_LEASE_TWICE": (("TB.CONSUME", "e", "1", "5", "LEASE", "1", "LEASE", "1"), ""),
    "ERR_LEASE_MODE": (("TB.CONSUME", "e", "1", "5", "1", "RESERVE", "5", "LEASE", "100"), ""),
    "ERR_LEASE_N": (("TB.MCONSUME", "2", "e", "f", "1", "5", "1", "0", "1", "0", "LEASE", "2", "100"), ""),
    "ERR_LEASE_FULL": (("TB.CONSUME", "lf", "0", "2000", "1", "LEASE", "60000"), ""),
    "ERR_LEASE_ID": (("TB.RELEASE", "e", "9007199254740993"), ""),
    "ERR_USED": (("TB.RELEASE", "e", "1", "USED", "-1"), ""),
    "ERR_RELEASE_OPTION": (("TB.RELEASE", "e", "1", "KEEP", "1"), ""),
    "ERR_LEASE_PART": (("TB.MCONSUME", "1", "e", "1", "5", "1", "LEASE", "2", "100"), ""),
}


def module_reply(pair: Pair, args: tuple[Any, ...], in_multi: bool) -> str:
    m = pair.raw[0]
    try:
        if in_multi:
            p = m.pipeline(transaction=True)
            p.execute_command(*args)
            reply = p.execute(raise_on_error=False)[0]
            if isinstance(reply, Exception):
                raise reply
            return repr(reply)
        return repr(m.execute_command(*args))
    except redis.ResponseError as e:
        return f"error: {e}"


def test_every_error_agrees(pair: Pair) -> None:
    unknown = ERRORS.keys() - MODULE_ONLY - ERROR_CALLS.keys()
    assert not unknown, (f"error lines of src/errors.rs with no call here: {sorted(unknown)}; add a call that "
                         "the Lua fallback answers the same way, or list them in MODULE_ONLY")
    gone = (MODULE_ONLY | ERROR_CALLS.keys()) - ERRORS.keys()
    assert not gone, f"not in protocol/catalogue.json (renamed or removed in src/errors.rs?): {sorted(gone)}"
    for r in pair.raw:
        r.set("str", "x")
    for lim in pair.limiters:  # a bucket that holds the most leases it may
        for _ in range(LIMITS["MAX_LEASES"]):
            call("TB.CONSUME", "lf", "0", "2000", "1", "LEASE", "60000")(lim)
    for name, (args, expected) in ERROR_CALLS.items():
        text = expected if expected and expected != "in MULTI" else ERRORS[name]
        # redis-py drops the ERR code from the message, as it does for any error.
        want = "error: " + (text[4:] if text.startswith("ERR ") else text)
        m = module_reply(pair, args, expected == "in MULTI")
        try:
            lua = repr(call(*args)(pair.limiters[1]))
        except redis.ResponseError as e:
            lua = f"error: {e}"
        assert m == want, (name, args, m)
        assert lua == want, (name, args, lua)
        assert [r.exists("e", "f") for r in pair.raw] == [0, 0], ("an error changes nothing", args)
