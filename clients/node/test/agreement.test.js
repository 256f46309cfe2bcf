// The module and the Lua fallback agree reply for reply, through the Node
// client (the same comparison as clients/python/tests/test_agreement.py).
//
// Both servers run the same calls and every reply (or error) is compared.
// The timeline is controlled so that no reply depends on when a call runs:
// - fresh keys at rates that refill nothing during a test (0, 1e-12);
// - buckets whose stored time lies an hour in the future: both count time
//   before the stored time as zero, so every call computes at that instant;
// - buckets stored days to years in the past at slow rates, whose refill,
//   computed exactly for the earliest and latest instant the calls could
//   have read, is the same nano-token count (checked, not assumed).
//
// Random cases use a seeded generator: the seed is printed, and
// TB_AGREEMENT_SEED=<seed> replays it.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import Redis from 'ioredis';
import { Limiter } from 'tb-limiter';

import { Server } from './helpers/server.js';

const NANOS = 10n ** 9n;
const MAX_AMOUNT = 2n ** 53n;
const UNITS = { s: 1n, m: 60n, h: 3600n, d: 86400n };

let servers;
let raw; // [module, lua] admin connections
let limiters; // [module, lua]

before(async () => {
  servers = [await Server.start({ module: true }), await Server.start({ module: false })];
  // Integers as strings: replies beyond 2^53 stay exact.
  raw = servers.map((s) => new Redis(s.port, '127.0.0.1', { stringNumbers: true }));
  limiters = raw.map((r) => new Limiter(r));
});
after(async () => {
  for (const r of raw ?? []) await r.quit();
  for (const s of servers ?? []) await s.stop();
});

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
  if (typeof m === 'string' && typeof lua === 'string' && /^-?\d+$/.test(m) && /^-?\d+$/.test(lua)) {
    const a = BigInt(m);
    const b = BigInt(lua);
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
  assert.ok(agree(m, lua), `${JSON.stringify(what)}: module ${JSON.stringify(m)} != lua ${JSON.stringify(lua)}`);
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

/** TB.INFO without updated_at_ms and ttl_ms (they tell the time). */
function infoWithoutClock(key) {
  return async (lim) => {
    const reply = await call('TB.INFO', key)(lim);
    if (reply === null) return null;
    const out = [];
    for (let i = 0; i < reply.length; i += 2) {
      if (reply[i] !== 'updated_at_ms' && reply[i] !== 'ttl_ms') out.push(reply[i], reply[i + 1]);
    }
    return out;
  };
}

async function timeUs() {
  const [sec, usec] = await raw[0].time();
  return BigInt(sec) * 1_000_000n + BigInt(usec);
}

/** Stores the same bucket on both: TB.SETSTATE on the module, the script's hash on the other. */
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

async function flush() {
  for (const r of raw) await r.flushall();
}

// A shared sequence on fresh keys, where nothing refills during the test.
const FRESH_SEQUENCE = [
  ['TB.CONSUME', 'q', '0', '5'],
  ['TB.CONSUME', 'q', '0', '5', '3'],
  ['TB.CONSUME', 'q', '0', '5', '2'], // 1 left: never (rate 0)
  ['TB.CONSUME', 'q', '0', '5', '6'], // above capacity: never
  ['TB.CONSUME', 'q', '0', '5', '0'], // peek
  ['TB.CONSUME', 'q', '0', '5', '4', 'ATMOST'],
  ['TB.CONSUME', 'q', '0', '5', '1', 'ATMOST'],
  ['TB.REFUND', 'q', '2'],
  ['TB.CONSUME', 'q', '0', '7', '2'], // capacity change
  ['TB.REFUND', 'q', '100'],
  ['TB.REFUND', 'missing', '1'],
  ['TB.INFO', 'missing'],
  ['TB.CONSUME', 'slow', '1e-12', '10', '4'],
  ['TB.CONSUME', 'slow', '1e-12', '10', '7'],
  ['TB.CONSUME', 'slow', '1e-12', '10', '7', 'RESERVE', '60000'],
  ['TB.CONSUME', 'slow', '1e-12', '10', '7', 'ATMOST'],
  ['TB.CONSUME', 'slow', '1e-12', '10', '0'],
  ['TB.CONSUME', 'slow', '2e-12', '10', '1'], // rate change
  ['TB.CONSUME', 'slow', '2e-12', '10', '1', 'ATMOST'],
  ['TB.CONSUME', 'slow', '2e-12', '10', '11'],
  ['TB.CONSUME', 'fresh', '1e-12', '0', '0'],
  ['TB.CONSUME', 'fresh', '1e-12', '0', '1'],
  ['TB.MCONSUME', '2', '{t}a', '{t}b', '0', '3', '1', '1e-12', '1000', '600'],
  ['TB.MCONSUME', '2', '{t}a', '{t}b', '0', '3', '1', '1e-12', '1000', '600'],
  ['TB.MCONSUME', '2', '{t}a', '{t}b', '0', '3', '1', '1e-12', '1000', '400'],
  ['TB.MCONSUME', '2', '{t}a', '{t}b', '0', '3', '9', '1e-12', '1000', '1'],
  ['TB.MCONSUME', '2', '{t}a', '{t}b', '0', '3', '1', '1e-12', '1000', '1', 'RESERVE', '60000'],
  ['TB.MCONSUME', '2', '{t}a', '{t}a', '0', '3', '1', '0', '3', '1'],
  ['TB.MCONSUME', '1', '{t}a', '0', '3', '1', 'FROB', '1'],
  ['TB.MCONSUME', '1', '{t}a', '0', '3', '1', 'RESERVE', '60001'],
  // errors: same message, nothing changes
  ['TB.CONSUME', 'e', '-1', '5'],
  ['TB.CONSUME', 'e', '1e1000', '5'],
  ['TB.CONSUME', 'e', '1e-13', '5'],
  ['TB.CONSUME', 'e', '1e39', '5'],
  ['TB.CONSUME', 'e', '1234567890123456789012345678901', '5'],
  ['TB.CONSUME', 'e', '1/x', '5'],
  ['TB.CONSUME', 'e', '/m', '5'],
  ['TB.CONSUME', 'e', '.', '5'],
  ['TB.CONSUME', 'e', '1', '9007199254740993'],
  ['TB.CONSUME', 'e', '1', '5', '-1'],
  ['TB.CONSUME', 'e', '1', '5', 'FROB'],
  ['TB.CONSUME', 'e', '1', '5', '1', 'FROB'],
  ['TB.CONSUME', 'e', '1', '5', 'ATMOST', 'ATMOST'],
  ['TB.CONSUME', 'e', '1', '5', '1', 'ATMOST', 'RESERVE', '5'],
  ['TB.CONSUME', 'e', '1', '5', '1', 'RESERVE', '86400001'],
  ['TB.CONSUME', 'e', '1', '5', '1', 'RESERVE', '60001'],
  ['TB.CONSUME', 'e', '1', '5', '1', 'RESERVE'],
  ['TB.REFUND', 'e', 'x'],
  ['TB.INFO', 'e'],
];

test('a fixed sequence on fresh keys agrees', async () => {
  await flush();
  for (const step of FRESH_SEQUENCE) {
    await same(call(...step), step);
    await same(infoWithoutClock(step[0] === 'TB.MCONSUME' ? step[2] : step[1]), step);
  }
  for (const key of ['q', 'slow', 'fresh', '{t}a', '{t}b', 'e']) {
    const [m, lua] = await expireTimes(key);
    assert.equal(m < 0, lua < 0, key);
  }
});

test('WRONGTYPE agrees, and changes nothing', async () => {
  await flush();
  for (const r of raw) await r.set('s', 'x');
  for (const step of [
    ['TB.CONSUME', 's', '1', '5'],
    ['TB.REFUND', 's', '1'],
    ['TB.INFO', 's'],
    ['TB.MCONSUME', '2', 'ok', 's', '1', '5', '1', '1', '5', '1'],
  ]) {
    const reply = await same(call(...step), step);
    assert.match(String(reply), /^error: WRONGTYPE/);
  }
  assert.equal(await same((_, r) => r.exists('ok')), '0', 'an error changes nothing');
});

const r = (n, d = 1n) => [n, d];
const FROZEN_STEPS = [
  [['TB.CONSUME', 'k', '10', '5', '1'], [0n, r(10n), 5n]],
  [['TB.CONSUME', 'k', '10', '5', '1', 'RESERVE', '1000'], null],
  [['TB.CONSUME', 'k', '10', '5', '1', 'RESERVE', '1000'], null],
  [['TB.CONSUME', 'k', '10', '5', '20', 'RESERVE', '1000'], null],
  [['TB.CONSUME', 'k', '10', '5', '0'], null],
  [['TB.REFUND', 'k', '1'], null],
  [['TB.CONSUME', 'k', '3', '3', '1'], [0n, r(3n), 3n]], // 334 ms: rounded up
  [['TB.CONSUME', 'k', '100/m', '7', '2'], [1_500_000_000n, r(5n, 3n), 7n]],
  [['TB.CONSUME', 'k', '100/m', '7', '5', 'ATMOST'], null],
  [['TB.CONSUME', 'k', '100/m', '7', '5', 'ATMOST'], null],
  [['TB.CONSUME', 'k', '1e12', String(MAX_AMOUNT), String(MAX_AMOUNT)], [12_345n, r(10n ** 12n), MAX_AMOUNT]],
  [['TB.CONSUME', 'k', '1e12', String(MAX_AMOUNT), '1', 'ATMOST'], null],
  [['TB.CONSUME', 'k', '9e15', String(MAX_AMOUNT), '3', 'RESERVE', '60000'], [1n, r(9n * 10n ** 15n), MAX_AMOUNT]],
  [['TB.CONSUME', 'k', '1e-12', String(MAX_AMOUNT), '1'], [0n, r(1n, 10n ** 12n), MAX_AMOUNT]],
  [['TB.CONSUME', 'k', '0.000000000001', String(MAX_AMOUNT), '0'], null],
  [['TB.CONSUME', 'k', '7/d', '1000', '999', 'RESERVE', '60000'], [998n * NANOS + 999_999_999n, r(7n, 86400n), 1000n]],
  [['TB.CONSUME', 'k', '7/h', '10', '1'], [-3n * NANOS - 1n, r(7n, 3600n), 10n]], // in debt
  [['TB.CONSUME', 'k', '1', '10', '1'], null], // rate switch while in debt
  [['TB.REFUND', 'k', '2'], null],
  [['TB.CONSUME', 'k', '2.5e9', '1000000000000', '999999999999'], [999_999_999_999n * NANOS - 1n, r(25n * 10n ** 8n), 10n ** 12n]],
  [['TB.CONSUME', 'k', '1', '5', '1'], [5n * NANOS - 1n, r(1n), 5n]],
  [['TB.REFUND', 'k', '0'], null],
];

test('a frozen timeline agrees at fast and odd rates', async () => {
  await flush();
  const future = (await timeUs()) + 3600n * 1_000_000n;
  for (const [step, state] of FROZEN_STEPS) {
    if (state) await setState('k', state[0], future, state[1], state[2]);
    await same(call(...step), step);
    await same(infoWithoutClock('k'), step);
    const [m, lua] = await expireTimes('k');
    assert.equal(m, lua, JSON.stringify(step));
  }
});

const RATE_CHOICES = ['0', '1', '10', '0.5', '3', '7', '100/m', '1/h', '7/d', '1e-12', '3e-12', '1e-3', '2.5e9', '1e12', '9e15',
  '123.456789', '1/d', '0.001/d'];

function randomRate(g) {
  return g.next() < 0.5 ? g.pick(RATE_CHOICES) : `${g.int(1, 9_999_999)}e${g.int(-12, 8)}`;
}

function randomCapacity(g) {
  return g.pick([() => BigInt(g.int(0, 20)), () => g.big(0n, MAX_AMOUNT), () => MAX_AMOUNT, () => 10n ** 12n])();
}

const SEED = Number(process.env.TB_AGREEMENT_SEED || Math.floor(Math.random() * 2 ** 31));

test(`300 random frozen states and requests agree (seed ${SEED})`, async () => {
  console.log(`# agreement seed ${SEED} (replay: TB_AGREEMENT_SEED=${SEED})`);
  const g = rng(SEED);
  await flush();
  for (let i = 0; i < 300; i++) {
    let storedRate;
    do storedRate = randomRate(g);
    while (!validRate(storedRate));
    const cap = randomCapacity(g);
    // Debt stays within 2^53 tokens in all (the script's documented range).
    const low = -(MAX_AMOUNT - cap) * NANOS;
    const nanos = g.pick([
      () => g.big(low > -10n * NANOS ? low : -10n * NANOS, cap * NANOS),
      () => g.big(low, cap * NANOS),
      () => cap * NANOS,
    ])();
    const sameLimits = g.next() < 0.5;
    const rate = sameLimits ? storedRate : randomRate(g);
    const reqCap = sameLimits ? cap : randomCapacity(g);
    const n = g.pick([() => BigInt(g.int(0, 3)), () => g.big(0n, reqCap > 1n ? reqCap : 1n), () => reqCap + 1n, () => MAX_AMOUNT])();
    const mode = g.pick([[], ['ATMOST'], ['RESERVE', '0'], ['RESERVE', '1000'], ['RESERVE', '60000']]);
    const kind = g.pick(['consume', 'consume', 'consume', 'refund', 'mconsume']);
    const what = { i, storedRate, cap: String(cap), nanos: String(nanos), rate, reqCap: String(reqCap), n: String(n), mode, kind };
    const future = (await timeUs()) + 3600n * 1_000_000n;
    await setState('{x}k', nanos, future, exactRate(storedRate), cap);
    if (kind === 'consume') {
      await same(call('TB.CONSUME', '{x}k', rate, reqCap, n, ...mode), what);
    } else if (kind === 'refund') {
      await same(call('TB.REFUND', '{x}k', n), what);
    } else {
      await setState('{x}j', (cap * NANOS) / 2n, future, exactRate(storedRate), cap);
      const opt = mode[0] === 'RESERVE' ? mode : [];
      await same(call('TB.MCONSUME', 2, '{x}k', '{x}j', rate, reqCap, n, storedRate, cap, 1, ...opt), what);
      await same(infoWithoutClock('{x}j'), what);
      const [mj, lj] = await expireTimes('{x}j');
      assert.equal(mj, lj, JSON.stringify(what));
    }
    await same(infoWithoutClock('{x}k'), what);
    const [m, lua] = await expireTimes('{x}k');
    assert.equal(m, lua, JSON.stringify(what));
  }
});

/** bucket.rs Bucket::settle, in BigInt. */
function settle(nanos, elapsedUs, [num, den], cap) {
  if (nanos >= cap * NANOS) return nanos;
  const add = (elapsedUs * num * 1000n) / den;
  const full = cap * NANOS;
  return nanos + add < full ? nanos + add : full;
}

test('long refills from the past agree (exact beyond 2^53)', async () => {
  await flush();
  const g = rng(SEED ^ 0x5eed);
  let checked = 0;
  for (let attempt = 0; attempt < 120 && checked < 60; attempt++) {
    const rate =
      attempt % 4 === 0
        ? `${g.int(1, 10 ** 6)}e-${g.int(3, 6)}` // fills the bucket: stable at capacity
        : `${g.int(1, 1000)}${g.pick(['e-12', 'e-9/m', 'e-8/h', 'e-6/d'])}`; // about a nano-token a second at most
    const exact = exactRate(rate);
    if (exact[1] > 2n ** 40n) continue;
    const cap = g.pick([10n, 10n ** 6n, 10n ** 12n, MAX_AMOUNT]);
    const nanos = g.big(-(10n ** 12n), (cap * NANOS) / 2n);
    const agoUs = g.big(86_400n * 10n ** 6n, 3n * 365n * 86_400n * 10n ** 6n);
    const before = await timeUs();
    const lo = (before / 1000n) * 1000n; // the module on Redis 7.0 reads a ms clock
    const updated = before - agoUs;
    await setState('p', nanos, updated, exact, cap);
    const n = g.pick([1n, 2n, cap]);
    const infos = await both(infoWithoutClock('p'));
    const replies = await both(call('TB.CONSUME', 'p', rate, cap, n));
    const hi = (await timeUs()) + 1000n;
    if (settle(nanos, lo - updated, exact, cap) !== settle(nanos, hi - updated, exact, cap)) continue; // crossed a nano-token
    const what = { rate, cap: String(cap), nanos: String(nanos), agoUs: String(agoUs), n: String(n) };
    assert.ok(agree(replies[0], replies[1]), `${JSON.stringify(what)}: ${JSON.stringify(replies)}`);
    assert.ok(agree(infos[0], infos[1]), `${JSON.stringify(what)}: ${JSON.stringify(infos)}`);
    checked += 1;
  }
  assert.equal(checked, 60, `only ${checked} cases had a stable refill`);
});
