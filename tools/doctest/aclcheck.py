"""What an ACL line in the docs claims, tested on a real server.

A block with ``<!-- doctest: acl user=NAME allows=... denies=... -->`` is
applied first (a ``conf`` block is the server's configuration, a
``console`` block is replayed); then, logged in as NAME:

- every command of the ``allows`` suites must run without error;
- every attempt of the ``denies`` suites must get ``NOPERM`` (or, for a
  command called by a script, Redis' ACL refusal of it) and change
  nothing: the buckets (``DUMP`` and ``PEXPIRETIME``), the number of keys,
  the ``tb.*`` and eviction settings, the users, the loaded modules, the
  replication role and the server's life are compared before and after
  each attempt, from a connection of the harness' own admin user.

Suites:

- ``limiter``: TB.CONSUME (plain, peek, ATMOST, RESERVE, BLOCK),
  TB.MCONSUME (with RESERVE), TB.REFUND, TB.INFO, CL.THROTTLE, on keys that
  the user's first key pattern allows;
- ``tamper``: every way to get tokens back, change a limit or a setting, or
  reach past the user's own keys: the generic key commands (DEL, UNLINK,
  GETDEL, SET, RESTORE, RENAME, COPY, MOVE, SWAPDB, FLUSHDB, FLUSHALL,
  EXPIRE and friends, PERSIST), TB.SETSTATE, TB.CONFIG, CONFIG SET, scripts
  and functions (EVAL, EVALSHA, SCRIPT LOAD, FUNCTION LOAD, FCALL), MODULE,
  ACL, DEBUG, AUTH/HELLO as another user, REPLICAOF, FAILOVER, CLIENT
  KILL, SHUTDOWN, and every limiter command on another tenant's key;
- a command name (``tb.setstate``): the ``tamper`` attempts of that command.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

#: The harness' own admin user, added to every server an acl block runs on.
ADMIN_USER = "doctest-admin"
ADMIN_PASSWORD = "doctest-admin-5f1c9e"
ADMIN_CONF = f"user {ADMIN_USER} on >{ADMIN_PASSWORD} ~* &* +@all"
#: Commands that Redis refuses by default before ACL is asked (MODULE,
#: DEBUG) are enabled where ACL claims are tested, so that the refusal
#: tested is the ACL's.
UNPROTECTED_CONF = "enable-module-command yes\nenable-debug-command yes"

_LUA_DEL = "return redis.call('DEL', KEYS[1])"
# How Redis words an ACL refusal of a command called by a script.
_SCRIPT_ACL = "The user executing the script can't run this command"
_FUNCTION = "#!lua name=doctestlib\nredis.register_function('doctestdel', function(k) return redis.call('DEL', k[1]) end)"


@dataclass
class Keys:
    own: str
    own2: str
    tag_a: str
    tag_b: str
    other: str


def keys_for(pattern: str) -> Keys:
    """Keys inside the user's first key pattern, and one outside any tenant's."""
    def make(suffix: str) -> str:
        k = pattern.replace("*", suffix, 1).replace("*", "").replace("?", "x")
        return re.sub(r"\[[^\]]*\]", "x", k)

    return Keys(make("doctest"), make("doctest2"), make("{doctest}:a"), make("{doctest}:b"),
                "othertenant:doctest")


def limiter_suite(k: Keys) -> list[list[str]]:
    return [
        ["TB.CONSUME", k.own, "10", "5"],
        ["TB.CONSUME", k.own, "10", "5", "0"],
        ["TB.CONSUME", k.own, "10", "5", "2", "ATMOST"],
        ["TB.CONSUME", k.own, "10", "5", "5", "RESERVE", "2000"],
        ["TB.CONSUME", k.own, "10", "5", "1", "BLOCK", "2000"],
        ["TB.MCONSUME", "2", k.tag_a, k.tag_b, "10", "5", "1", "100/m", "100", "7", "RESERVE", "1000"],
        ["TB.REFUND", k.own, "1"],
        ["TB.INFO", k.own],
        ["CL.THROTTLE", k.own2, "4", "10", "1"],
    ]


def tamper_suite(k: Keys, payload: bytes) -> list[list[Any]]:
    own, other = k.own, k.other
    return [
        ["DEL", own],
        ["UNLINK", own],
        ["GETDEL", own],
        ["GETEX", own, "PERSIST"],
        ["SET", own, "x"],
        ["RESTORE", own, "0", payload, "REPLACE"],
        ["RENAME", own, k.own2],
        ["RENAMENX", own, k.own2],
        ["COPY", other, own, "REPLACE"],
        ["MOVE", own, "1"],
        ["SWAPDB", "0", "1"],
        ["EXPIRE", own, "1"],
        ["PEXPIRE", own, "1"],
        ["EXPIREAT", own, "1"],
        ["PEXPIREAT", own, "1"],
        ["PERSIST", own],
        ["TB.SETSTATE", own, "5000000000", "1", "10", "1", "5", "0"],
        ["TB.CONFIG", "SET", "max-wait-ms", "1"],
        ["TB.CONFIG", "SET", "expire-idle", "no"],
        ["TB.CONFIG", "RESETSTAT"],
        ["CONFIG", "SET", "tb.max-wait-ms", "1"],
        ["CONFIG", "SET", "tb.expire-idle", "no"],
        ["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"],
        ["CONFIG", "SET", "maxmemory", "1"],
        ["EVAL", _LUA_DEL, "1", own],
        ["EVAL", f"return redis.call('DEL', '{own}')", "0"],
        ["EVAL_RO", "return 1", "0"],
        ["EVALSHA", "0000000000000000000000000000000000000000", "1", own],
        ["SCRIPT", "LOAD", _LUA_DEL],
        ["FUNCTION", "LOAD", _FUNCTION],
        ["FCALL", "doctestdel", "1", own],
        ["MODULE", "UNLOAD", "tb"],
        ["MODULE", "LOAD", "/nonexistent/doctest.so"],
        ["ACL", "SETUSER", "{self}", "+@all", "~*"],
        ["ACL", "LOAD"],
        ["AUTH", "default", "doctest-guess"],
        ["HELLO", "2", "AUTH", "default", "doctest-guess"],
        ["REPLICAOF", "127.0.0.1", "1"],
        ["FAILOVER", "TO", "127.0.0.1", "1"],
        ["CLIENT", "KILL", "TYPE", "normal"],
        ["DEBUG", "SLEEP", "0"],
        ["TB.CONSUME", other, "1000000", "1000000"],
        ["TB.CONSUME", other, "10", "5", "1", "RESERVE", "1000"],
        ["TB.MCONSUME", "2", own, other, "10", "5", "1", "10", "5", "1"],
        ["TB.REFUND", other, "5"],
        ["TB.INFO", other],
        ["CL.THROTTLE", other, "4", "10", "1"],
        ["DEL", other],
        ["FLUSHDB"],
        ["FLUSHALL"],
        ["SHUTDOWN", "NOSAVE"],
    ]


def admin_client(port: int) -> redis.Redis:
    # One immediate retry: an attempt may be CLIENT KILL of every connection.
    return redis.Redis(
        port=port, username=ADMIN_USER, password=ADMIN_PASSWORD, socket_timeout=30,
        retry=Retry(NoBackoff(), 1),
    )


def _snapshot(admin: redis.Redis, k: Keys) -> dict[str, Any]:
    """Everything an attempt could change, read by the admin user."""
    snap: dict[str, Any] = {}
    for key in (k.own, k.other):
        snap[f"DUMP {key}"] = admin.dump(key)
        snap[f"PEXPIRETIME {key}"] = admin.execute_command("PEXPIRETIME", key)
    snap["DBSIZE"] = admin.dbsize()
    snap["CONFIG"] = sorted(
        (admin.config_get("tb.*") | admin.config_get("maxmemory*")).items()
    )
    snap["ACL LIST"] = admin.acl_list()
    snap["MODULE LIST"] = sorted(str(m) for m in admin.module_list())
    snap["ROLE"] = admin.execute_command("ROLE")[0]
    return snap


def password_of(block_text: str, user: str) -> str:
    """The first ``>password`` rule on the line that defines ``user``."""
    for line in block_text.splitlines():
        words = line.replace("'", " ").replace('"', " ").split()
        if user in words and any(w.lower() in ("user", "setuser") for w in words):
            for w in words[words.index(user) + 1 :]:
                if w.startswith(">"):
                    return w[1:]
                if w == "nopass":
                    return "doctest-any-password"
    raise AssertionError(f"no >password rule for user {user!r} in the block")


def _key_pattern(admin: redis.Redis, user: str) -> str:
    """The user's first key pattern; ``doctest:*`` for a user with no key
    (whose attempts on those keys must all be refused)."""
    info = admin.acl_getuser(user)
    if info is None:
        raise AssertionError(f"the block did not create ACL user {user!r}")
    keys = info.get("keys")
    text = " ".join(map(str, keys)) if isinstance(keys, list) else str(keys or "")
    m = re.search(r"~(\S+)", text)
    return m.group(1) if m else "doctest:*"


def check(port: int, block_text: str, user: str, allows: list[str], denies: list[str]) -> None:
    """Tests the claims of an acl directive; AssertionError listing every
    claim that does not hold."""
    admin = admin_client(port)
    password = password_of(block_text, user)
    k = keys_for(_key_pattern(admin, user))

    def as_user() -> redis.Redis:
        # No retry: an attempt that breaks the connection is reported as such.
        return redis.Redis(
            port=port, username=user, password=password, socket_timeout=30,
            retry=Retry(NoBackoff(), 0),
        )

    try:
        as_user().execute_command("AUTH", user, password)
    except redis.AuthenticationError as e:
        raise AssertionError(f"cannot log in as {user!r} with the block's password: {e}") from e

    # Buckets to protect, the user's own and another tenant's, refilling
    # slowly enough not to expire while the attempts run.
    admin.execute_command("TB.CONSUME", k.own, "0.001", "10", "4")
    admin.execute_command("TB.CONSUME", k.other, "0.001", "10", "4")
    payload = admin.dump(k.other)
    assert payload is not None

    problems: list[str] = []
    for suite in denies:
        attempts = tamper_suite(k, payload)
        if suite != "tamper":
            attempts = [a for a in attempts if str(a[0]).lower() == suite.lower()]
            if not attempts:
                raise AssertionError(f"unknown ACL suite or command {suite!r} in denies=")
        for attempt in attempts:
            attempt = [user if a == "{self}" else a for a in attempt]
            before = _snapshot(admin, k)
            c = as_user()
            try:
                reply = c.execute_command(*attempt)
                problems.append(f"{_show(attempt)} was allowed: {reply!r}")
            except redis.exceptions.NoPermissionError:
                pass
            except redis.ResponseError as e:
                if _SCRIPT_ACL not in str(e):  # ACL refusing a command inside a script
                    problems.append(f"{_show(attempt)}: not NOPERM but {e}")
            except redis.AuthenticationError as e:
                if attempt[0] not in ("AUTH", "HELLO"):  # WRONGPASS: refused as well
                    problems.append(f"{_show(attempt)}: {e}")
            except redis.ConnectionError as e:
                problems.append(f"{_show(attempt)}: the connection broke ({e})")
            finally:
                c.close()
            try:
                after = _snapshot(admin, k)
            except redis.ConnectionError as e:
                problems.append(f"after {_show(attempt)} the server is gone ({e})")
                raise AssertionError("ACL claims do not hold:\n" + "\n".join(problems)) from e
            for what in before:
                if before[what] != after[what]:
                    problems.append(f"{_show(attempt)} changed {what}")
    for suite in allows:
        if suite != "limiter":
            raise AssertionError(f"unknown ACL suite {suite!r} in allows=")
        c = as_user()
        for cmd in limiter_suite(k):
            try:
                c.execute_command(*cmd)
            except redis.RedisError as e:
                problems.append(f"{_show(cmd)} was refused: {e}")
        c.close()
    if problems:
        raise AssertionError(
            f"ACL claims for user {user!r} do not hold:\n" + "\n".join(problems)
        )


def _show(argv: list[Any]) -> str:
    return " ".join(repr(a)[:20] if isinstance(a, bytes) else str(a)[:40] for a in argv)

