// The module and the Lua fallback agree reply for reply, through the Node
// client, on a controlled clock (the comparison
// clients/python/tests/test_agreement.py makes).
//
// Both servers run under the clockshift shim (tests/clockshift/clockshift.c)
// and read one control file, which freezes their wall clock at the same
// instant; the tests move that instant forwards and back between calls. So
// every reply, every TB.INFO field (updated_at_ms and ttl_ms included) and
// every key's expiry is compared exactly, at any rate, across clock steps,
// with states stored in the past or in the future. On Redis 7.0 the module
// reads a millisecond clock while a script reads TIME in microseconds: there
// the clock is only frozen on whole milliseconds, where both agree.
//
// Random cases use a seeded generator: the seed is printed, and
// TB_AGREEMENT_SEED=<seed> replays it.

import assert from 'node:assert/strict';
import { mkdtempSync, openSync, rmSync, writeSync, closeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';

import Redis from 'ioredis';
import { Limiter } from 'tb-limiter';

import { Server, clockshiftEnv } from './helpers/server.js';

const NANOS = 10n ** 9n;
const MAX_AMOUNT = 2n ** 53n;
const UNITS = { s: 1n, m: 60n, h: 3600n, d: 86400n };

const SEC = 1_000_000n;
// Where the frozen clock starts (2026-11-22), in microseconds.
const T0 = 1_795_300_000n * SEC;

/**
 * The shim's control file: a seqlock word, a mode (0 shift, 1 frozen) and a
 * value in microseconds, native-endian int64s.
 */
class Clock {
  constructor(file) {
    this.file = file;
    this.seq = 0n;
    this.write(0n, [1n, T0]);
  }

  write(seq, fields, at = 0) {
    const buf = Buffer.alloc(8 * (1 + fields.length));
    buf.writeBigInt64LE(seq, 0);
    fields.forEach((v, i) => buf.writeBigInt64LE(v, 8 * (i + 1)));
    const fd = openSync(this.file, at === 0 && seq === 0n && this.seq === 0n ? 'w' : 'r+');
    writeSync(fd, buf, 0, buf.length, at);
    closeSync(fd);
  }

  freeze(atUs) {
    this.write(this.seq + 1n, [1n, atUs]); // odd: the readers wait
    this.seq += 2n;
    this.write(this.seq, []); // even again, with the new value in place
  }
}

let dir;
let clock;
let servers;
let raw; // [module, lua] admin connections
let limiters; // [module, lua]
let micros; // whether the module reads microseconds (Redis 7.2+)
let now; // the frozen instant, in microseconds

before(async () => {
  dir = mkdtempSync(path.join(tmpdir(), 'tb-clock-'));
  clock = new Clock(path.join(dir, 'clock'));
  const env = clockshiftEnv(clock.file);
  const args = ['--enable-debug-command', 'local'];
  servers = [await Server.start({ module: true, env, args })];
  servers.push(await Server.start({ module: false, env, args }));
  // Integers as strings: replies beyond 2^53 stay exact.
  raw = servers.map((s) => new Redis(s.port, '127.0.0.1', { stringNumbers: true }));
  // Active expiry off: on a frozen clock it deletes a key whose expiry is the
  // current millisecond (Redis 8.2 expires at now >= t) while a lookup keeps
  // it (now > t), at moments set by the real time of its cycle, so the two
  // servers could hold different keys. Lookups alone expire keys alike.
  for (const r of raw) await r.call('DEBUG', 'SET-ACTIVE-EXPIRE', '0');
  limiters = [new Limiter(raw[0], { backend: 'module' }), new Limiter(raw[1], { backend: 'lua' })];
  micros = true;
  micros = await moduleReadsMicroseconds();
  at(T0);
});
after(async () => {
  for (const r of raw ?? []) await r.quit();
  for (const s of servers ?? []) await s.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

async function moduleReadsMicroseconds() {
  clock.freeze(T0 + 500n);
  await raw[0].call('TB.SETSTATE', 'probe', '0', String(T0), '1', '1', '1', '0');
  const reply = await raw[0].call('TB.INFO', 'probe');
  await raw[0].del('probe');
  return reply[reply.indexOf('tokens') + 1] === '0.0005';
}

/** Freezes both servers' clock at `tUs` (a whole ms when the module reads ms). */
function at(tUs) {
  now = micros ? tUs : tUs - (tUs % 1000n);
  clock.freeze(now);
}

function step(deltaUs) {
  at(now + BigInt(deltaUs));
}

/** A seeded PRNG (mulberry32): `next()` in [0, 1). */
function rng(seed) {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const int = (lo, hi) => lo + Math.floor(next() * (hi - lo + 1)); // within 2^53
  const big = (lo, hi) => lo + (BigInt(Math.floor(next() * 2 ** 53)) * (hi - lo + 1n)) / 2n ** 53n;
  const pick = (xs) => xs[Math.floor(next() * xs.length)];
  return { next, int, big, pick };
}

function gcd(a, b) {
  while (b) [a, b] = [b, a % b];
  return a;
}

/** The exact rate the module parses from a valid rate string: [num, den]. */
function exactRate(rate) {
  let unit = 1n;
  let s = rate;
  if (s.length >= 2 && s.at(-2) === '/') {
    unit = UNITS[s.at(-1).toLowerCase()];
    s = s.slice(0, -2);
  }
  let [mant, exp = '0'] = s.toLowerCase().split('e');
  let e = BigInt(exp);
  const [int, frac = ''] = mant.split('.');
  let num = BigInt(int + frac || '0');
  e -= BigInt(frac.length);
  let den = unit;
  if (e >= 0n) num *= 10n ** e;
  else den *= 10n ** -e;
  if (num === 0n) return [0n, 1n];
  const g = gcd(num, den);
  return [num / g, den / g];
}

function validRate(rate) {
  const [n, d] = exactRate(rate);
  return n === 0n || (n <= MAX_AMOUNT && d <= 2n ** 40n);
}

/** Equal replies, except that an integer beyond 2^53 reaches Redis from Lua as the nearest double. */
function agree(m, lua) {
  if (Array.isArray(m) && Array.isArray(lua)) return m.length === lua.length && m.every((x, i) => agree(x, lua[i]));
  // An integer, or the whole part of a decimal (TB.INFO's tokens), beyond
  // 2^53: a debt the script holds as the nearest double (tb.lua's header).
  const whole = /^(-?\d+)(\.\d+)?$/;
  if (typeof m === 'string' && typeof lua === 'string' && whole.test(m) && whole.test(lua)) {
    const a = BigInt(m.match(whole)[1]);
    const b = BigInt(lua.match(whole)[1]);
    const abs = (x) => (x < 0n ? -x : x);
    if (abs(a) > MAX_AMOUNT) return abs(a - b) * 2n ** 51n <= abs(a);
  }
  return JSON.stringify(m) === JSON.stringify(lua);
}

/** Runs `fn(limiter, raw)` on both backends: a reply, or the error text. */
async function both(fn) {
  const out = [];
  for (let i = 0; i < 2; i++) {
    try {
      out.push(await fn(limiters[i], raw[i]));
    } catch (e) {
      out.push(`error: ${e.message}`);
    }
  }
  return out;
}

async function same(fn, what) {
  const [m, lua] = await both(fn);
  const shown = (x) => JSON.stringify(x, (_, v) => (typeof v === 'bigint' ? String(v) : v))?.slice(0, 2000);
  assert.ok(agree(m, lua), `${shown(what)} at ${now}: module ${shown(m)} != lua ${shown(lua)}`);
  return m;
}

/** A raw command in the module's spelling, through each limiter. */
function call(...args) {
  const name = String(args[0]).toUpperCase();
  let keys;
  let rest;
  if (name === 'TB.MCONSUME') {
    const k = Number(args[1]);
    keys = args.slice(2, 2 + k);
    rest = args.slice(2 + k);
  } else {
    keys = args.slice(1, 2);
    rest = args.slice(2);
  }
  return (lim) => lim.execute(name, keys, rest.map(String));
}

/** TB.INFO, every field (null for a missing key). */
function info(key) {
  return (lim) => call('TB.INFO', key)(lim);
}

/** Stores the same bucket on both: TB.SETSTATE on the module, the script's hash on the other (no expiry). */
async function setState(key, nanos, updatedUs, [num, den], capacity) {
  await raw[0].call('TB.SETSTATE', key, String(nanos), String(updatedUs), String(num), String(den), String(capacity), '0');
  const w = nanos >= 0n ? nanos / NANOS : -((-nanos + NANOS - 1n) / NANOS);
  const f = nanos - w * NANOS;
  await raw[1].del(key);
  await raw[1].hset(key, { w: String(w), f: String(f), t: String(updatedUs), rn: String(num), rd: String(den), c: String(capacity) });
}

async function expireTimes(key) {
  return Promise.all(raw.map(async (r) => Number(await r.call('PEXPIRETIME', key))));
}

/** TB.INFO (every field) and the key's absolute expiry are equal on both. */
async function keysAgree(keys, what) {
  for (const k of keys) {
    await same(info(k), [what, k]);
    const [m, lua] = await expireTimes(k);
    assert.equal(m, lua, JSON.stringify([what, k]));
  }
}

async function flush() {
  for (const r of raw) await r.flushall();
  at(T0);
}

// A shared sequence, with the clock moving (microseconds) before some calls.
const MAX = String(MAX_AMOUNT);
const S = 1_000_000;
const SEQUENCE = [
  [0, ['TB.CONSUME', 'q', '0', '5']],
  [0, ['TB.CONSUME', 'q', '0', '5', '3']],
  [0, ['TB.CONSUME', 'q', '0', '5', '2']], // 1 left: never (rate 0)
  [0, ['TB.CONSUME', 'q', '0', '5', '6']], // above capacity: never
  [0, ['TB.CONSUME', 'q', '0', '5', '0']], // peek: one token is there
  [0, ['TB.CONSUME', 'q', '0', '5', '4', 'ATMOST']],
  [0, ['TB.CONSUME', 'q', '0', '5', '1', 'ATMOST']],
  [0, ['TB.CONSUME', 'q', '0', '5', '0']], // peek on an empty fixed budget: never
  [0, ['TB.REFUND', 'q', '2']],
  [0, ['TB.CONSUME', 'q', '0', '7', '2']], // capacity change
  [0, ['TB.REFUND', 'q', '100']],
  [0, ['TB.REFUND', 'missing', '1']],
  [0, ['TB.INFO', 'missing']],
  [0, ['TB.CONSUME', 'p', '0.001', '3', '3']], // a peek on an empty bucket: the wait for one token
  [0, ['TB.CONSUME', 'p', '0.001', '3', '0']],
  [0, ['TB.CONSUME', 'p', '0.001', '3', '1']],
  [999 * S, ['TB.CONSUME', 'p', '0.001', '3', '0']],
  [S, ['TB.CONSUME', 'p', '0.001', '3', '0']],
  [0, ['TB.CONSUME', 'z', '1', '0', '0']], // capacity 0: a peek is never served
  [0, ['TB.CONSUME', 'k', '10', '5', '1']],
  [0, ['TB.CONSUME', 'k', '10', '5', '4', 'RESERVE', '1000']],
  [0, ['TB.CONSUME', 'k', '10', '5', '3', 'RESERVE', '1000']], // queued behind the debt
  [0, ['TB.CONSUME', 'k', '10', '5', '20', 'RESERVE', '1000']],
  [0, ['TB.CONSUME', 'k', '10', '5', '0']],
  [150_000, ['TB.CONSUME', 'k', '10', '5', '0']],
  [200_000, ['TB.CONSUME', 'k', '10', '5', '1']],
  [-20 * S, ['TB.CONSUME', 'k', '10', '5', '1']], // a step back: waits count it
  [0, ['TB.CONSUME', 'k', '10', '5', '1', 'RESERVE', '20100']],
  [0, ['TB.MCONSUME', '2', 'k', 'k2', '10', '5', '1', '1', '1', '1']],
  [20 * S, ['TB.CONSUME', 'k', '10', '5', '1']],
  [1_000, ['TB.CONSUME', 'k', '3', '3', '1']], // rate change: 334 ms rounded up
  [333_000, ['TB.CONSUME', 'k', '3', '3', '1']],
  [1_000, ['TB.CONSUME', 'k', '3', '3', '1']],
  [0, ['TB.CONSUME', 'k', '100/m', '7', '2']],
  [3_000, ['TB.CONSUME', 'k', '100/m', '7', '5', 'ATMOST']],
  [0, ['TB.CONSUME', 'slow', '1e-12', '10', '4']],
  [0, ['TB.CONSUME', 'slow', '1e-12', '10', '7']],
  [0, ['TB.CONSUME', 'slow', '1e-12', '10', '7', 'RESERVE', '60000']],
  [0, ['TB.CONSUME', 'slow', '1e-12', '10', '7', 'ATMOST']],
  [0, ['TB.CONSUME', 'slow', '1e-12', '10', '0']],
  [0, ['TB.CONSUME', 'slow', '2e-12', '10', '1']], // rate change
  [0, ['TB.CONSUME', 'slow', '2e-12', '10', '11']],
  [0, ['TB.CONSUME', 'big', '9e15', MAX, MAX]],
  [1, ['TB.CONSUME', 'big', '9e15', MAX, '3', 'RESERVE', '60000']],
  [0, ['TB.CONSUME', 'big', '1e-12', MAX, '0']],
  [0, ['TB.MCONSUME', '2', '{t}a', '{t}b', '0', '3', '1', '1e-12', '1000', '600']],
  [0, ['TB.MCONSUME', '2', '{t}a', '{t}b', '0', '3', '1', '1e-12', '1000', '600']],
  [0, ['TB.MCONSUME', '2', '{t}a', '{t}b', '0', '3', '1', '1e-12', '1000', '400']],
  [0, ['TB.MCONSUME', '2', '{t}a', '{t}b', '0', '3', '9', '1e-12', '1000', '1']],
  [0, ['TB.MCONSUME', '2', '{t}a', '{t}b', '0', '3', '1', '1e-12', '1000', '1', 'RESERVE', '60000']],
  [0, ['TB.MCONSUME', '2', '{t}a', '{t}b', '0', '3', '0', '1e-12', '1000', '0']], // peeks
  [0, ['TB.MCONSUME', '1', '{t}c', '1e-12', '0', '0']],
  // Every spelling of a rate in range, the same fraction.
  [0, ['TB.CONSUME', 'r1', '1e0001', '20', '1']],
  [0, ['TB.CONSUME', 'r1', '10', '20', '1']],
  [0, ['TB.CONSUME', 'r2', '1000000000000000000000000000000e-30', '20', '1']],
  [0, ['TB.CONSUME', 'r2', '1', '20', '1']],
  [0, ['TB.CONSUME', 'r3', '8191.99999999999909050529822707176208496093750000', '9', '1']],
  [0, ['TB.CONSUME', 'r4', `0.${'0'.repeat(100_000)}1e100001`, '9', '1']],
  [0, ['TB.CONSUME', 'r5', '5e-0000000000000000000000000000003/d', '9', '1']],
  [0, ['TB.CONSUME', 'r6', '0e99999999999999999999999999', '9', '1']],
  // ATMOST MIN chunk: a chunk or nothing, and the wait for the chunk
  [0, ['TB.CONSUME', 'm', '10', '100', '100']],
  [0, ['TB.CONSUME', 'm', '10', '100', '50', 'ATMOST', 'MIN', '20']],
  [1_500_000, ['TB.CONSUME', 'm', '10', '100', '50', 'ATMOST', 'MIN', '20']],
  [500_000, ['TB.CONSUME', 'm', '10', '100', '50', 'ATMOST', 'MIN', '20']],
  [0, ['TB.CONSUME', 'm', '10', '100', '3', 'min', '20', 'atmost']],
  [0, ['TB.MCONSUME', '3', '{s}u', '{s}g', '{s}r', '10', '100', '60', '5', '30', '60', '1', '10', '1', 'ATMOST', 'MIN', '20']],
  [0, ['TB.MCONSUME', '3', '{s}u', '{s}g', '{s}r', '10', '100', '60', '5', '30', '60', '1', '10', '1', 'ATMOST', 'MIN', '20']],
  [2_000_000, ['TB.MCONSUME', '3', '{s}u', '{s}g', '{s}r', '10', '100', '60', '5', '30', '60', '1', '10', '1', 'ATMOST']],
  // errors: the same message, nothing changes
  [0, ['TB.CONSUME', 'e', '-1', '5']],
  [0, ['TB.CONSUME', 'e', '1e', '5']],
  [0, ['TB.CONSUME', 'e', '1e-13', '5']],
  [0, ['TB.CONSUME', 'e', '1/x', '5']],
  [0, ['TB.CONSUME', 'e', '1', '9007199254740993']],
  [0, ['TB.CONSUME', 'e', '1', '5', '-1']],
  [0, ['TB.CONSUME', 'e', '1', '5', '1', 'FROB']],
  [0, ['TB.CONSUME', 'e', '1', '5', 'ATMOST', 'ATMOST']],
  [0, ['TB.CONSUME', 'e', '1', '5', '1', 'ATMOST', 'RESERVE', '5']],
  [0, ['TB.CONSUME', 'e', '1', '5', '1', 'RESERVE', '86400001']],
  [0, ['TB.CONSUME', 'e', '1', '5', '1', 'RESERVE', '60001']],
  [0, ['TB.CONSUME', 'e', '1', '5', '1', 'BLOCK', '5', 'ATMOST']],
  [0, ['TB.MCONSUME', '1', 'e', '1', '5', '1', 'RESERVE', '60001']],
  [0, ['TB.MCONSUME', '2', 'e', 'f', '1', '5', '1']],
  [0, ['TB.MCONSUME', '2', 'e', 'e', '1', '5', '1', '1', '5', '1']],
  [0, ['TB.MCONSUME', '1', 'e', '1', '5', '1', 'BLOCK', '5', 'ATMOST']],
  [0, ['TB.CONSUME', 'e', '1', '5', '1', 'RESERVE', '5', 'FLOW', 'a']],
  [0, ['TB.MCONSUME', '1', 'e', '1', '5', '1', 'FLOW', 'a']],
  [0, ['TB.MCONSUME', '1', 'e', '1', '5', '1', 'BLOCK', '5', 'FLOW', 'x'.repeat(129)]],
  [0, ['TB.CONSUME', 'e', '1', '5', '1', 'BLOCK', '5', 'FLOW', '']],
  [0, ['TB.CONSUME', 'e', '1', '5', 'BLOCK', '5', 'FLOW', 'a', 'WEIGHT', '1000001']],
  [0, ['TB.CONSUME', 'e', '1', '5', 'BLOCK', '5', 'FLOW', 'a', 'WEIGHT', '0']],
  [0, ['TB.CONSUME', 'e', '1', '5', '1', 'BLOCK', '5', 'WEIGHT', '2', 'FLOW', 'a']],
  [0, ['TB.CONSUME', 'e', '1', '5', '9', 'ATMOST', 'MIN', '6']],
  [0, ['TB.CONSUME', 'e', '1', '5', '9', 'ATMOST', 'MIN', '0']],
  [0, ['TB.CONSUME', 'e', '1', '5', '9', 'MIN', '2']],
  [0, ['TB.MCONSUME', '2', 'e', 'f', '1', '5', '9', '1', '3', '9', 'ATMOST', 'MIN', '4']],
  [0, ['TB.MCONSUME', '1', 'e', '1', '5', '9', 'ATMOST', 'MIN']],
  [0, ['TB.MCONSUME', '1', 'e', '1', '5', '9', 'ATMOST', 'RESERVE', '5']],
  [0, ['TB.REFUND', 'e', 'x']],
  [0, ['TB.INFO', 'e']],
];

const keysOf = (s) => (s[0] === 'TB.MCONSUME' ? s.slice(2, 2 + Number(s[1])) : s.slice(1, 2));

test('a shared sequence agrees, the clock moving between calls', async () => {
  await flush();
  for (const [delta, s] of SEQUENCE) {
    step(delta);
    await same(call(...s), s);
    await keysAgree(keysOf(s), s);
  }
  assert.deepEqual(await Promise.all(raw.map((r) => r.exists('e', 'f'))), ['0', '0'], 'errors change nothing');
});

// Leases (issue 13): lent, released once, settled up and down, expired
// lazily, and leased parts of TB.MCONSUME. '$x' stands for the lease id a
// step saved as 'x': the last element of its reply, or with 'x:j' the lease
// id of TB.MCONSUME's part j. Lease ids are random, each backend's own:
// replies agree with ids compared as "0 or not", every id handed out is new,
// and each backend's later steps use its own ids.
const LEASES = [
  [0, 'a', ['TB.CONSUME', 'in', '0', '2', '1', 'LEASE', '1000']],
  [1, 'b', ['TB.CONSUME', 'in', '0', '2', '1', 'LEASE', '2000']],
  [0, '', ['TB.CONSUME', 'in', '0', '2', '1', 'LEASE', '1000']], // denied: the wait for the first expiry
  [0, '', ['TB.CONSUME', 'in', '0', '2', '0']],
  [0, '', ['TB.RELEASE', 'in', '$a']],
  [0, '', ['TB.RELEASE', 'in', '$a']], // nil the second time
  [2_000_000, '', ['TB.CONSUME', 'in', '0', '2', '2', 'LEASE', '500']], // b expired
  [0, '', ['TB.RELEASE', 'in', '$b']],
  [0, 't', ['TB.CONSUME', 'tpm', '100', '1000', '400', 'LEASE', '60000']],
  [10_000, '', ['TB.RELEASE', 'tpm', '$t', 'USED', '900']], // into debt
  [0, '', ['TB.CONSUME', 'tpm', '100', '1000', '200']],
  [0, 'i:2', ['TB.MCONSUME', '3', '{u}r', '{u}t', '{u}i', '60/m', '60', '1', '1000/m', '1000', '300', '0', '1', '1',
    'LEASE', '3', '30000', 'LEASE', '2', '30000']],
  [0, '', ['TB.MCONSUME', '3', '{u}r', '{u}t', '{u}i', '60/m', '60', '1', '1000/m', '1000', '300', '0', '1', '1',
    'LEASE', '3', '30000', 'RESERVE', '10000']], // the leased part is short: denied
  [0, '', ['TB.RELEASE', '{u}t', '$i', 'USED', '100']],
  // KEEP (issue 18): an estimate's tokens stay used at its expiry, a slot's
  // come back; the release reply is what went back after the cap.
  [0, 'k', ['TB.CONSUME', 'keep', '1', '10', '6', 'LEASE', '1000', 'KEEP']],
  [0, '', ['TB.CONSUME', 'keep', '1', '10', '4', 'LEASE', '1000']],
  [1_000_000, '', ['TB.INFO', 'keep']],
  [0, '', ['TB.RELEASE', 'keep', '$k']],
  [0, 'm', ['TB.MCONSUME', '2', '{k}a', '{k}b', '0', '5', '2', '1', '10', '3', 'LEASE', '1', '500', 'LEASE', '2', '500',
    'KEEP']],
  [0, '', ['TB.RELEASE', '{k}b', '$m', 'USED', '1']],
  [600_000, '', ['TB.MCONSUME', '2', '{k}a', '{k}b', '0', '5', '0', '1', '10', '0']],
  [0, 'f', ['TB.CONSUME', 'full', '0', '10', '4', 'LEASE', '60000']],
  [0, '', ['TB.REFUND', 'full', '3']],
  [0, '', ['TB.RELEASE', 'full', '$f']], // 1 of 4 went back
  [0, '', ['TB.CONSUME', 'e', '1', '5', 'LEASE', '0']],
  [0, '', ['TB.CONSUME', 'e', '1', '5', '1', 'RESERVE', '5', 'LEASE', '9']],
  [0, '', ['TB.RELEASE', 'e', '1', 'KEEP', '1']],
  [0, '', ['TB.MCONSUME', '1', 'e', '1', '5', '1', 'LEASE', '2', '100']],
];

/** Where the lease ids are in the reply to step `s`. */
function leaseIdSlots(s, reply) {
  if (!Array.isArray(reply) || !s.some((a) => a.toUpperCase() === 'LEASE')) return [];
  if (s[0] === 'TB.CONSUME') return [5];
  const k = Number(s[1]);
  return Array.from({ length: k }, (_, j) => reply.length - k + j);
}

test('leases agree: lent, released once, settled, expired, kept, in TB.MCONSUME', async () => {
  await flush();
  const ids = [{}, {}];
  const seen = [new Set(), new Set()];
  for (const [delta, save, raw] of LEASES) {
    step(delta);
    const replies = [];
    const masked = [];
    for (let b = 0; b < 2; b++) {
      const s = raw.map((a) => (a.startsWith('$') ? ids[b][a.slice(1)] : a));
      let reply;
      try {
        reply = await call(...s)(limiters[b]);
      } catch (e) {
        reply = `error: ${e.message}`;
      }
      replies.push(reply);
      const slots = leaseIdSlots(raw, reply);
      const shown = slots.length ? [...reply] : reply;
      for (const at of slots) {
        const id = BigInt(reply[at]);
        if (id !== 0n) {
          assert.ok(id >= 1n && id < 2n ** 53n && !seen[b].has(id), JSON.stringify([raw, b, String(reply)]));
          seen[b].add(id);
          shown[at] = 'id';
        }
      }
      masked.push(shown);
      if (save) {
        assert.ok(Array.isArray(reply) && Number(reply[0]) === 1, JSON.stringify([s, String(reply)]));
        const [name, part] = save.split(':');
        ids[b][name] = String(part ? reply[reply.length - Number(s[1]) + Number(part) - 1] : reply[reply.length - 1]);
      }
    }
    assert.ok(agree(masked[0], masked[1]), `${JSON.stringify(raw)} at ${now}: module ${replies[0]} != lua ${replies[1]}`);
    await keysAgree(keysOf(raw), raw);
  }
});

test('WRONGTYPE agrees, and changes nothing', async () => {
  await flush();
  for (const r of raw) await r.set('s', 'x');
  for (const s of [
    ['TB.CONSUME', 's', '1', '5'],
    ['TB.REFUND', 's', '1'],
    ['TB.INFO', 's'],
    ['TB.MCONSUME', '2', 'ok', 's', '1', '5', '1', '1', '5', '1'],
  ]) {
    const reply = await same(call(...s), s);
    assert.match(String(reply), /^error: WRONGTYPE/);
  }
  assert.equal(await same((_, r) => r.exists('ok')), '0', 'an error changes nothing');
});

test('exact on time: 73 tokens at 264 s, served exactly then', async () => {
  // 15 reservations a millisecond apart at 1/3 token/s: no write loses a fraction.
  await flush();
  await same(call('TB.CONSUME', 'x', '20/m', '200', '200'));
  const start = now;
  for (let i = 0; i < 15; i++) {
    step(1000);
    await same(call('TB.CONSUME', 'x', '20/m', '200', '1', 'RESERVE', '60000'));
  }
  at(start + 264n * SEC - 1000n);
  assert.deepEqual((await same(call('TB.CONSUME', 'x', '20/m', '200', '73'))).slice(0, 3), ['0', '72', '1']);
  at(start + 264n * SEC);
  const i = await same(info('x'));
  assert.equal(i[i.indexOf('tokens') + 1], '73');
  assert.deepEqual(await same(call('TB.CONSUME', 'x', '20/m', '200', '73')), ['1', '0', '0', '600000', '73']);
});

test('clock steps agree: waits after a step back count the time to get past it', async () => {
  await flush();
  await same(call('TB.CONSUME', 's', '1', '10', '10'));
  await keysAgree(['s']);
  for (const delta of [-20 * S, -1, 0, 19 * S, S - 1, 2, -3600 * S, 3600 * S + 4 * S]) {
    step(delta);
    assert.ok(['0', '1'].includes((await same(call('TB.CONSUME', 's', '1', '10', '0')))[0]));
    await same(call('TB.CONSUME', 's', '1', '10', '1', 'RESERVE', '30000'), delta);
    await same(call('TB.MCONSUME', '1', 's', '1', '10', '2'), delta);
    await same(call('TB.REFUND', 's', '1'), delta);
    await keysAgree(['s'], delta);
  }
});

const RATE_CHOICES = ['0', '1', '10', '0.5', '3', '7', '100/m', '1/h', '7/d', '1e-12', '3e-12', '20/m', '1e-3', '2.5e9',
  '1e12', '9e15', '123.456789', '1/d', '0.001/d'];

function randomRate(g) {
  return g.next() < 0.5 ? g.pick(RATE_CHOICES) : `${g.int(1, 9_999_999)}e${g.int(-12, 8)}`;
}

function randomCapacity(g) {
  return g.pick([() => BigInt(g.int(0, 20)), () => g.big(0n, MAX_AMOUNT), () => MAX_AMOUNT, () => 10n ** 12n])();
}

/** Clock moves: none, microseconds to seconds either way, and days to years. */
function randomStep(g) {
  return g.pick([
    () => 0n,
    () => BigInt(g.int(-2 * S, 5 * S)),
    () => BigInt(g.int(-40 * S, 40 * S)),
    () => g.big(-400n * 86400n * SEC, 3n * 365n * 86400n * SEC),
  ])();
}

/** Any valid stored state, in debt down to 2^53 tokens (the script's range), stored in the past or the future. */
function randomState(g) {
  let rate;
  do rate = randomRate(g);
  while (!validRate(rate));
  const cap = randomCapacity(g);
  const low = -(MAX_AMOUNT - cap) * NANOS;
  const nanos = g.pick([
    () => g.big(low > -10n * NANOS ? low : -10n * NANOS, cap * NANOS),
    () => g.big(low, cap * NANOS),
    () => cap * NANOS,
  ])();
  return { rate, cap, nanos, updated: randomStep(g) };
}

function randomOperation(g) {
  const kind = g.pick(['consume', 'consume', 'consume', 'refund', 'mconsume', 'state']);
  const key = g.pick(['{x}a', '{x}b']);
  if (kind === 'state') return ['state', key, randomState(g)];
  if (kind === 'refund') return ['TB.REFUND', key, String(g.pick([() => BigInt(g.int(0, 3)), () => g.big(0n, MAX_AMOUNT)])())];
  const rate = randomRate(g);
  const cap = randomCapacity(g);
  const n = g.pick([() => BigInt(g.int(0, 3)), () => g.big(0n, cap > 1n ? cap : 1n), () => cap + 1n, () => MAX_AMOUNT])();
  if (kind === 'mconsume') {
    const cap2 = randomCapacity(g);
    const low = cap < cap2 ? cap : cap2;
    const chunk = () => String(g.pick([() => BigInt(g.int(1, 5)), () => g.big(1n, low > 1n ? low : 1n)])());
    const opt = g.pick([[], ['RESERVE', '0'], ['RESERVE', '1000'], ['RESERVE', '60000'], ['ATMOST'],
      () => ['ATMOST', 'MIN', chunk()]]);
    return ['TB.MCONSUME', '2', '{x}a', '{x}b', rate, String(cap), String(n), randomRate(g), String(cap2),
      String(g.pick([() => g.int(0, 3), () => n])()), ...(typeof opt === 'function' ? opt() : opt)];
  }
  const mode = g.pick([[], ['ATMOST'], ['RESERVE', '0'], ['RESERVE', '1000'], ['RESERVE', '60000'],
    () => ['ATMOST', 'MIN', String(g.pick([() => BigInt(g.int(1, 5)), () => g.big(1n, cap > 1n ? cap : 1n)])())]]);
  if (typeof mode === 'function') return ['TB.CONSUME', key, rate, String(cap), String(n), ...mode()];
  return ['TB.CONSUME', key, rate, String(cap), String(n), ...mode];
}

const SEED = Number(process.env.TB_AGREEMENT_SEED || Math.floor(Math.random() * 2 ** 31));

test(`200 random timelines agree: states, calls, clock moves (seed ${SEED})`, async () => {
  console.log(`# agreement seed ${SEED} (replay: TB_AGREEMENT_SEED=${SEED})`);
  const g = rng(SEED);
  for (let t = 0; t < 200; t++) {
    await flush();
    const steps = g.int(1, 12);
    for (let i = 0; i < steps; i++) {
      const delta = randomStep(g);
      const op = randomOperation(g);
      const what = { seed: SEED, timeline: t, i, delta: String(delta), op: JSON.stringify(op, (_, v) => (typeof v === 'bigint' ? String(v) : v)) };
      step(delta);
      if (op[0] === 'state') {
        const { rate, cap, nanos, updated } = op[2];
        let atUs = now + updated;
        if (!micros) atUs -= atUs % 1000n;
        await setState(op[1], nanos, atUs, exactRate(rate), cap);
      } else {
        await same(call(...op), what);
      }
      await keysAgree(['{x}a', '{x}b'], what);
    }
  }
});

test('long refills from the past agree (exact beyond 2^53)', async () => {
  await flush();
  const g = rng(SEED ^ 0x5eed);
  let checked = 0;
  for (let i = 0; i < 80; i++) {
    const rate = g.pick([
      () => `${g.int(1, 10 ** 6)}e-${g.int(3, 6)}`,
      () => `${g.int(1, 1000)}${g.pick(['e-12', 'e-9/m', 'e-8/h', 'e-6/d', '/d', '/m'])}`,
    ])();
    const exact = exactRate(rate);
    if (exact[1] > 2n ** 40n) continue;
    const cap = g.pick([10n, 10n ** 6n, 10n ** 12n, MAX_AMOUNT]);
    const nanos = g.big(-(10n ** 12n), (cap * NANOS) / 2n);
    at(T0 + BigInt(g.int(0, 10 ** 9)));
    let updated = now - g.big(86_400n * SEC, 3n * 365n * 86_400n * SEC);
    if (!micros) updated -= updated % 1000n;
    const what = { rate, cap: String(cap), nanos: String(nanos), updated: String(updated) };
    await setState('p', nanos, updated, exact, cap);
    await keysAgree(['p'], what);
    await same(call('TB.CONSUME', 'p', rate, cap, g.pick([0n, 1n, 2n, cap])), what);
    await keysAgree(['p'], what);
    checked += 1;
  }
  assert.ok(checked >= 40, `${checked} cases`);
});
