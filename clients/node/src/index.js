// Node.js client of the tb Redis module: a fleet-wide token bucket.
//
//   import { Limiter } from 'tb-limiter';
//   const limiter = new Limiter(redisClient);          // node-redis 4+ or ioredis 5+
//   const llm = limiter.bucket('llm:openai', '0.5', 1);
//   const r = await llm.consume();                     // Result { allowed, remaining, ... }
//   await llm.acquire({ timeoutMs: 30_000 });          // waits without holding the connection
//
// The module answers when the server has it; otherwise the same commands run
// as one Lua script (tb.lua, a byte-identical copy of the repository's
// lua/tb.lua) with the same replies.

import { createHash, randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';

import { DEFAULT_MAX_WAIT_MS, MAX_LEASE_ID } from './catalogue.js';
import { connect } from './connection.js';
import { RateLimited, CommandError, NotSentError, describeKey, isReplyError, asCommandError, isUnknownCommand, maxWaitFrom } from './errors.js';
import { int, Result, MultiResult, BucketInfo } from './results.js';
import { rateArg, amountArg, waitArg, flowArgs, pause, waitReserved } from './args.js';
import { Batcher } from './batcher.js';
import { leaseTtl, blockLease, pollLease, runLeased, Lease } from './leases.js';
export { BucketInfo, MultiResult, Result } from './results.js';
export { CommandError, NotSentError, RateLimited } from './errors.js';
export { Batcher } from './batcher.js';
export { Lease } from './leases.js';

// The public types (options, keys, amounts) are JSDoc typedefs at the end of
// this file; tsc generates the shipped declarations (types/) from them.


/** Source of the Lua fallback (`tb.lua` in this package). */
export const SCRIPT = readFileSync(new URL('./tb.lua', import.meta.url), 'utf8');

/** Largest lease id (the module's and the Lua fallback's: 2^53 - 1). */
const LUA_MAX_LEASE_ID = BigInt(MAX_LEASE_ID);

/**
 * ARGV for the Lua fallback: the command name, then its arguments; before
 * them, for a call that may grant a lease, `LEASE-SEED r`: the script cannot
 * draw secure randomness, so its lease ids come from `r`, a random integer
 * from 1 to 2^53 - 1 drawn here (lua/tb.lua).
 * @param {string} name
 * @param {ReadonlyArray<string | Buffer>} args
 * @returns {Array<string | Buffer>}
 */
function scriptTail(name, args) {
  if (!args.some((a) => String(a).toUpperCase() === 'LEASE')) return [name, ...args];
  const seed = (randomBytes(8).readBigUInt64BE() % LUA_MAX_LEASE_ID) + 1n;
  return ['LEASE-SEED', String(seed), name, ...args];
}
/** SHA1 of {@link SCRIPT}, as EVALSHA takes it. */
export const SCRIPT_SHA1 = createHash('sha1').update(SCRIPT).digest('hex');
/** The longest wait the module accepts by default (`tb.max-wait-ms`). */
export { DEFAULT_MAX_WAIT_MS };


// ---------------------------------------------------------------------------
// Limiter and buckets
// ---------------------------------------------------------------------------

/**
 * Entry point: wraps a connected node-redis (4+) or ioredis (5+) client or
 * cluster, which stays the caller's (the limiter never closes it).
 *
 * `backend: 'auto'` (default) sends the module's commands and switches to the
 * Lua fallback when the server answers "unknown command" (no probe, no key,
 * no permission beyond the limiter's commands; the fallback needs EVALSHA,
 * EVAL or SCRIPT LOAD, and the commands the script calls). `'module'` or
 * `'lua'` force one.
 *
 * `maxWaitMs` is the server's `tb.max-wait-ms` when known; otherwise the
 * limiter assumes the default (60 s) and learns the real value from the
 * first reservation the server refuses as too long.
 *
 * @template {RedisClientLike} [C=RedisClientLike]
 */
export class Limiter {
  /** @internal @type {C} */
  _client;
  /** @internal @type {Connection} */
  _conn;
  /** @internal @type {Backend | 'auto'} */
  _wanted;
  /** @internal @type {Backend | null} */
  _backend;
  /** @internal @type {number | null} */
  _maxWaitMs;
  /** Dedicated connections for BLOCK, idle ones kept for the next wait. @internal @type {Connection[]} */
  _idle = [];
  /** @internal @type {Set<Connection>} */
  _dedicated = new Set();
  /** @internal */
  _closed = false;

  /**
   * @param {C} client
   * @param {LimiterOptions} [options]
   */
  constructor(client, { backend = 'auto', maxWaitMs } = {}) {
    if (!['auto', 'module', 'lua'].includes(backend)) {
      throw new RangeError(`backend must be 'auto', 'module' or 'lua', not ${JSON.stringify(backend)}`);
    }
    this._conn = connect(client);
    this._client = client;
    this._wanted = backend;
    this._backend = backend === 'auto' ? null : backend;
    this._maxWaitMs = maxWaitMs === undefined ? null : waitArg(maxWaitMs, 'maxWaitMs');
  }

  /** The client passed in, with its own type (never closed by the limiter). */
  get client() {
    return this._client;
  }

  /** `'module'` or `'lua'`; null until the first command has told (with `'auto'`). */
  get backend() {
    return this._backend;
  }

  /** The longest wait the server accepts, as far as the limiter knows. */
  get maxWaitMs() {
    return this._maxWaitMs ?? DEFAULT_MAX_WAIT_MS;
  }

  /**
   * The bucket under `key`, refilling at `rate` tokens/s up to `capacity`.
   * @param {Key} key
   * @param {Rate} rate
   * @param {Amount} capacity
   * @returns {TokenBucket}
   */
  bucket(key, rate, capacity) {
    return new TokenBucket(this, key, rate, capacity);
  }

  /**
   * Runs one command (`'TB.CONSUME'`, `'TB.MCONSUME'`, `'TB.REFUND'` or
   * `'TB.INFO'`) on the module or through the Lua fallback, with the
   * arguments after the keys as the module takes them, and returns the raw
   * reply. For TB.MCONSUME, `keys` are all its keys (numkeys is added).
   * @param {string} name
   * @param {ReadonlyArray<Key>} keys
   * @param {ReadonlyArray<string | number | bigint>} args
   * @returns {Promise<unknown>}
   */
  execute(name, keys, args) {
    return this._run(this._conn, name, keys, args.map(String));
  }

  /**
   * @internal
   * @param {Connection} conn
   * @param {string} name
   * @param {ReadonlyArray<Key>} keys
   * @param {ReadonlyArray<string | Buffer>} args
   * @returns {Promise<unknown>}
   */
  async _run(conn, name, keys, args) {
    if (this._closed) throw new Error('the limiter is closed');
    if (this._backend !== 'lua') {
      const head = name === 'TB.MCONSUME' ? [name, String(keys.length)] : [name];
      try {
        const reply = await conn.send(head, keys, args);
        this._backend ??= 'module';
        return reply;
      } catch (e) {
        if (this._wanted !== 'auto' || this._backend === 'module' || !isUnknownCommand(e)) {
          throw asCommandError(name, e);
        }
        this._backend = 'lua';
      }
    }
    const tail = scriptTail(name, args);
    try {
      return await conn.send(['EVALSHA', SCRIPT_SHA1, String(keys.length)], keys, tail);
    } catch (e) {
      if (!(isReplyError(e) && String(e.message).startsWith('NOSCRIPT'))) throw asCommandError(name, e);
    }
    // Not cached on that server (a restart, a failover, another node): EVAL
    // runs it and caches it for the next EVALSHA.
    try {
      return await conn.send(['EVAL', SCRIPT, String(keys.length)], keys, tail);
    } catch (e) {
      if (!(isReplyError(e) && /^NOPERM.*'eval'/i.test(String(e.message)))) throw asCommandError(name, e);
    }
    // A user allowed EVALSHA and SCRIPT LOAD but not EVAL: load it on the
    // node that serves the key, then run it.
    try {
      await conn.sendTo(keys[0], ['SCRIPT', 'LOAD', SCRIPT]);
      return await conn.send(['EVALSHA', SCRIPT_SHA1, String(keys.length)], keys, tail);
    } catch (e) {
      throw asCommandError(name, e);
    }
  }

  /**
   * Runs `run(w)` with the wait `w` = `waitMs` capped at the server's
   * `tb.max-wait-ms`; learns that setting from the server's refusal (and
   * retries once). Returns the reply and the wait used.
   * @internal
   * @param {number} waitMs
   * @param {(w: number) => Promise<unknown>} run
   * @returns {Promise<{ reply: unknown, windowMs: number }>}
   */
  async _withWait(waitMs, run) {
    const cap = this._maxWaitMs;
    const w = cap !== null && waitMs > cap ? cap : waitMs;
    try {
      return { reply: await run(w), windowMs: w };
    } catch (e) {
      const n = maxWaitFrom(e);
      if (n === null || n >= w) throw e;
      this._maxWaitMs = n;
      const w2 = Math.min(waitMs, n);
      return { reply: await run(w2), windowMs: w2 };
    }
  }

  /**
   * TB.MCONSUME: all or nothing across `[bucket, n]` pairs (requests and
   * tokens per minute...). With `maxWaitMs`, every bucket goes into debt if
   * all will have refilled by then, and `retryAfterMs` is the wait before
   * proceeding. In a cluster the keys must share a slot (`{tenant}:rpm`).
   * With `atmost` (and `chunk`), one shared partial grant of at least `chunk`.
   * @param {Iterable<readonly [TokenBucket, Amount]>} parts
   * @param {ReserveOptions & AtMostOptions} [options]
   * @returns {Promise<MultiResult>}
   */
  async consumeMany(parts, { maxWaitMs, atmost = false, chunk } = {}) {
    if (atmost && maxWaitMs !== undefined) throw new RangeError('atmost cannot be combined with maxWaitMs');
    const { reply } = await this._consumeMany(parts, maxWaitMs, atmostArgs(atmost, chunk));
    return MultiResult.fromReply(/** @type {unknown[]} */ (reply), atmost);
  }

  /**
   * @internal
   * @param {Iterable<readonly [TokenBucket, Amount]>} parts
   * @param {number | undefined} maxWaitMs
   * @param {string[]} [extra]
   * @returns {Promise<{ reply: unknown, windowMs: number }>}
   */
  _consumeMany(parts, maxWaitMs, extra = []) {
    const items = [...parts];
    if (items.length === 0) throw new RangeError('consumeMany needs at least one [bucket, n] pair');
    const keys = items.map(([b]) => b.key);
    const args = items.flatMap(([b, n]) => [b.rate, b._capacityArg, amountArg(n)]);
    if (maxWaitMs === undefined) {
      return this._run(this._conn, 'TB.MCONSUME', keys, [...args, ...extra]).then((reply) => ({ reply, windowMs: 0 }));
    }
    return this._withWait(waitArg(maxWaitMs, 'maxWaitMs'), (w) =>
      this._run(this._conn, 'TB.MCONSUME', keys, [...args, 'RESERVE', String(w)]),
    );
  }

  /**
   * Takes every `[bucket, n]` at once, waiting up to `timeoutMs` (default:
   * the server's longest wait): one reservation, then one timer; never polls
   * and never holds the connection. An aborted `signal` gives the
   * reservation back (TB.REFUND on each bucket) and throws its reason.
   * Throws {@link RateLimited} when the wait would be longer.
   *
   * `flow` and `weight` (see {@link TokenBucket#acquire}): the call waits on
   * the server (TB.MCONSUME ... BLOCK ms FLOW name [WEIGHT w], module only,
   * on a dedicated connection) in the flow's queue of the bucket that makes
   * it wait, reserving nothing, all or nothing; ignored on the Lua fallback.
   * @param {Iterable<readonly [TokenBucket, Amount]>} parts
   * @param {Omit<AcquireOptions, 'block'>} [options]
   * @returns {Promise<MultiResult>}
   */
  async acquireMany(parts, { timeoutMs, signal, flow, weight } = {}) {
    const queued = flowArgs(flow, weight);
    signal?.throwIfAborted();
    const items = [...parts];
    const label = items.map(([b]) => describeKey(b.key)).join(',');
    const limit = timeoutMs === undefined ? null : waitArg(timeoutMs, 'timeoutMs');
    const start = Date.now();
    const refundAll = () => Promise.all(items.map(([b, n]) => (Number(n) > 0 ? b.refund(n) : null)));
    if (queued.length > 0 && this.backend !== 'lua') {
      if (items.length === 0) throw new RangeError('acquireMany needs at least one [bucket, n] pair');
      const keys = items.map(([b]) => b.key);
      const args = items.flatMap(([b, n]) => [b.rate, b._capacityArg, amountArg(n)]);
      const r = await blockLease(
        this,
        (conn, w) => this._run(conn, 'TB.MCONSUME', keys, [...args, 'BLOCK', String(w), ...queued]),
        (reply) => MultiResult.fromReply(/** @type {unknown[]} */ (reply)),
        label,
        start + (limit ?? this.maxWaitMs),
        signal,
        (g) => (g.allowed ? refundAll() : null),
      );
      if (r) return r;
    }
    for (;;) {
      // The default timeout follows what the limiter learns of the server.
      const remaining = Math.max(0, start + (limit ?? this.maxWaitMs) - Date.now());
      const { reply, windowMs } = await this._consumeMany(items, remaining);
      const r = MultiResult.fromReply(/** @type {unknown[]} */ (reply));
      if (r.allowed) {
        if (r.retryAfterMs > 0) await waitReserved(r.retryAfterMs, signal, refundAll);
        return r;
      }
      if (r.never || r.retryAfterMs > remaining) throw new RateLimited(label, r);
      // The caller's timeout reaches past the server's longest wait: come
      // back when the wait fits it (holding nothing meanwhile).
      await pause(r.retryAfterMs - windowMs, signal);
    }
  }

  /**
   * TB.MCONSUME with leases, all or nothing: `parts` are `[bucket, n]`
   * (taken, as consumeMany) or `[bucket, n, 'estimate' | 'slot']` (lent for
   * `ttlMs`: an estimate with KEEP, so an expired one stays charged; a slot
   * without, so an expired one comes back). Denials are tried again as
   * {@link TokenBucket#lease} does, or, with `block: true`, waited for on
   * the server (BLOCK with LEASE, first come first served, one call per
   * grant; polled on the Lua fallback). Returns the {@link Lease}; see
   * {@link Limiter#withLeases} for the form that settles for you. `flow`
   * and `weight` (see {@link TokenBucket#acquire}) wait on the server in
   * the flow's queue of the bucket that makes the call wait, as `block`
   * does (with or without it); ignored on the Lua fallback.
   * @param {Iterable<LeasePart>} parts
   * @param {LeaseOptions} options
   * @returns {Promise<Lease<MultiResult>>}
   */
  async leaseMany(parts, options) {
    const { ttlMs, timeoutMs, signal, block = false, flow, weight } = options ?? /** @type {LeaseOptions} */ ({});
    const queued = flowArgs(flow, weight);
    /** @type {LeasedPart[]} */
    const items = [...parts].map(([bucket, n, kind]) => {
      if (kind !== undefined && kind !== 'estimate' && kind !== 'slot') {
        throw new RangeError(`a part's kind is 'estimate' or 'slot', not ${JSON.stringify(kind)}`);
      }
      return { bucket, n, kind: kind ?? 'taken' };
    });
    if (items.length === 0) throw new RangeError('leaseMany needs at least one [bucket, n] part');
    if (!items.some((p) => p.kind !== 'taken')) throw new RangeError("leaseMany needs a part of kind 'estimate' or 'slot'");
    const ttl = leaseTtl(ttlMs);
    const keys = items.map((p) => p.bucket.key);
    const args = items.flatMap((p) => [p.bucket.rate, p.bucket._capacityArg, amountArg(p.n)]);
    items.forEach((p, j) => {
      if (p.kind !== 'taken') args.push('LEASE', String(j + 1), String(ttl), ...(p.kind === 'estimate' ? ['KEEP'] : []));
    });
    const label = items.map((p) => describeKey(p.bucket.key)).join(',');
    const deadline = timeoutMs === undefined ? null : Date.now() + waitArg(timeoutMs, 'timeoutMs');
    /** @param {unknown} reply */
    const parse = (reply) => MultiResult.fromReply(/** @type {unknown[]} */ (reply), false, true);
    /** @param {MultiResult} granted */
    const undo = (granted) => (granted.allowed ? new Lease(items, granted).giveBack() : null);
    if ((block || queued.length > 0) && this.backend !== 'lua') {
      const r = await blockLease(
        this,
        (conn, w) => this._run(conn, 'TB.MCONSUME', keys, [...args, 'BLOCK', String(w), ...queued]),
        parse,
        label,
        deadline,
        signal,
        undo,
      );
      if (r) return new Lease(items, r);
    }
    const r = await pollLease(
      () => this._run(this._conn, 'TB.MCONSUME', keys, args).then(parse),
      label,
      deadline,
      signal,
      undo,
    );
    return new Lease(items, r);
  }

  /**
   * Runs `fn(lease)` holding the leases of {@link Limiter#leaseMany}, then:
   * - `fn` returned: slots are released, estimates settled to `lease.used`
   *   when `fn` set it (the tokens the call reported), else released;
   * - `fn` threw a {@link NotSentError} (or one `returnOn(err)` accepts):
   *   everything goes back, the parts taken too (the request never left);
   * - `fn` threw anything else (a timeout: the provider may still be working
   *   and billing): estimates stay charged in full (settled at the
   *   estimate) and slots stay held until their TTL. Nothing taken comes
   *   back.
   * `lease.giveBack()` in `fn` gives everything back at once.
   * @template T
   * @param {Iterable<LeasePart>} parts
   * @param {WithLeaseOptions} options
   * @param {(lease: Lease<MultiResult>) => Promise<T> | T} fn
   * @returns {Promise<T>}
   */
  async withLeases(parts, options, fn) {
    const { returnOn, ...rest } = options ?? {};
    return runLeased(await this.leaseMany(parts, rest), fn, returnOn);
  }

  /**
   * A dedicated connection for one BLOCK (reused once it is free again).
   * @internal
   * @returns {Promise<Connection>}
   */
  async _lease() {
    const conn = this._idle.pop() ?? (await this._conn.duplicate());
    this._dedicated.add(conn);
    if (this._closed) {
      this._release(conn);
      throw new Error('the limiter is closed');
    }
    return conn;
  }

  /**
   * Takes back a connection of `_lease` (closed when broken or the limiter is).
   * @internal
   * @param {Connection} conn
   * @param {boolean} [broken]
   */
  _release(conn, broken = false) {
    if (this._closed || broken) {
      this._dedicated.delete(conn);
      Promise.resolve()
        .then(() => conn.close?.())
        .catch(() => {});
    } else {
      this._idle.push(conn);
    }
  }

  /**
   * Closes the connections the limiter opened for BLOCK (never the client
   * passed in). A BLOCK still waiting fails; its reservation stays taken.
   */
  async close() {
    this._closed = true;
    const all = [...this._dedicated, ...this._idle];
    this._idle = [];
    this._dedicated.clear();
    await Promise.all(all.map((c) => Promise.resolve().then(() => c.close?.()).catch(() => {})));
  }
}

/**
 * `ATMOST [MIN chunk]`, or nothing; a chunk needs `atmost`.
 * @param {boolean} atmost
 * @param {Amount | undefined} chunk
 * @returns {string[]}
 */
function atmostArgs(atmost, chunk) {
  if (chunk !== undefined && !atmost) throw new RangeError('chunk is the smallest grant of atmost: true');
  if (!atmost) return [];
  return chunk === undefined ? ['ATMOST'] : ['ATMOST', 'MIN', amountArg(chunk, 'chunk')];
}

/** One bucket: `limiter.bucket('llm:openai', '0.5', 1)`. */
export class TokenBucket {
  /** The limiter that sends this bucket's commands. @readonly @type {Limiter} */
  limiter;
  /** @readonly @type {Key} */
  key;
  /** The rate as sent (`'0.5'`, `'100/m'`). @readonly @type {string} */
  rate;
  /** The capacity as sent. @internal @type {string} */
  _capacityArg;
  /** Burst size: the most tokens the bucket holds. @readonly @type {number} */
  capacity;

  /**
   * @param {Limiter} limiter
   * @param {Key} key
   * @param {Rate} rate
   * @param {Amount} capacity
   */
  constructor(limiter, key, rate, capacity) {
    if (typeof key !== 'string' && !Buffer.isBuffer(key)) throw new TypeError('key must be a string or a Buffer');
    this.limiter = limiter;
    this.key = key;
    this.rate = rateArg(rate);
    this._capacityArg = amountArg(capacity, 'capacity');
    this.capacity = Number(this._capacityArg);
  }

  /**
   * The arguments after the key: rate, capacity, n, then `rest`.
   * @internal
   * @param {Amount} n
   * @param {Array<string | Buffer>} rest
   * @returns {Array<string | Buffer>}
   */
  _args(n, ...rest) {
    return [this.rate, this._capacityArg, amountArg(n), ...rest];
  }

  /**
   * Takes `n` tokens now or none (`atmost`: as many whole tokens as are
   * there, at least `chunk` (default 1, or all of `n` when smaller), and a
   * denial's wait is the wait for `chunk`; `granted` says how many). `n = 0`
   * is a peek.
   * @param {Amount} [n]
   * @param {AtMostOptions} [options]
   * @returns {Promise<Result>}
   */
  async consume(n = 1, { atmost = false, chunk } = {}) {
    const args = this._args(n, ...atmostArgs(atmost, chunk));
    return resultOf(await this.limiter._run(this.limiter._conn, 'TB.CONSUME', [this.key], args));
  }

  /**
   * Whether a request would be served now; changes nothing.
   * @returns {Promise<Result>}
   */
  peek() {
    return this.consume(0);
  }

  /**
   * Hands this bucket's tokens out locally from batches of up to `batch`
   * taken in one call, for a hot key (see {@link Batcher}).
   * @param {number} batch
   * @param {BatchOptions} [options]
   * @returns {Batcher}
   */
  batched(batch, options = {}) {
    return new Batcher(this, batch, options);
  }

  /**
   * RESERVE: if the tokens will be there within `maxWaitMs` (default: the
   * server's longest wait; a longer one is capped to it), takes them now
   * (into debt) and returns `allowed` with the wait in `retryAfterMs`: wait
   * that long, then proceed. Later callers queue behind: first come, first
   * served across the fleet. Otherwise a denial (`allowed` false) that says
   * when to ask again.
   * @param {Amount} [n]
   * @param {ReserveOptions} [options]
   * @returns {Promise<Result>}
   */
  async reserve(n = 1, { maxWaitMs } = {}) {
    return resultOf((await this._reserve(n, maxWaitMs)).reply);
  }

  /**
   * TB.CONSUME ... RESERVE (or `mode`) ms, with the wait capped at the server's.
   * @internal
   * @param {Amount} n
   * @param {number | undefined} maxWaitMs
   * @param {Connection} [conn]
   * @param {'RESERVE' | 'BLOCK'} [mode]
   * @returns {Promise<{ reply: unknown, windowMs: number }>}
   */
  _reserve(n, maxWaitMs, conn = this.limiter._conn, mode = 'RESERVE') {
    const wait = maxWaitMs === undefined ? this.limiter.maxWaitMs : waitArg(maxWaitMs, 'maxWaitMs');
    return this.limiter._withWait(wait, (w) =>
      this.limiter._run(conn, 'TB.CONSUME', [this.key], this._args(n, mode, String(w))),
    );
  }

  /**
   * Waits until `n` tokens are taken, at most `timeoutMs` (default: the
   * server's longest wait), and returns the reservation.
   *
   * By default it reserves (one round trip) and waits on a timer: the
   * shared connection stays free for other commands. `block: true` lets the
   * server hold the reply instead (TB.CONSUME ... BLOCK, module only) on a
   * connection the limiter duplicates for it, so the shared one is never
   * stalled. A `timeoutMs` longer than the server's `tb.max-wait-ms` waits,
   * holding nothing, until the tokens are within reach, then reserves.
   *
   * An aborted `signal` throws its reason; tokens reserved for this call are
   * given back (TB.REFUND) at once, or with `block`, when the server's
   * delayed reply arrives. Throws {@link RateLimited} when the wait would be
   * longer than `timeoutMs` or the request can never succeed.
   *
   * `flow` (a tenant, a priority class: 1 to 128 bytes) and `weight` (1 to
   * 1000000, default 1): the call waits on the server in its flow's queue
   * (TB.CONSUME ... BLOCK ms FLOW name [WEIGHT w], module only, on a
   * dedicated connection, whether or not `block` is set) and reserves
   * nothing; while several flows wait on the bucket, grants go to them in
   * proportion to their weights, first come first served within a flow.
   * On the Lua fallback the flow is ignored (the call waits as without it).
   * @param {Amount} [n]
   * @param {AcquireOptions} [options]
   * @returns {Promise<Result>}
   */
  async acquire(n = 1, { timeoutMs, signal, block = false, flow, weight } = {}) {
    const queued = flowArgs(flow, weight);
    signal?.throwIfAborted();
    const limiter = this.limiter;
    const limit = timeoutMs === undefined ? null : waitArg(timeoutMs, 'timeoutMs');
    const start = Date.now();
    if (queued.length > 0 && limiter.backend !== 'lua') {
      const r = await blockLease(
        limiter,
        (conn, w) => limiter._run(conn, 'TB.CONSUME', [this.key], this._args(n, 'BLOCK', String(w), ...queued)),
        resultOf,
        this.key,
        start + (limit ?? limiter.maxWaitMs),
        signal,
        (g) => (g.granted > 0 ? this.refund(g.granted) : null),
      );
      // A queued grant replies as a non-blocking one: nothing left to wait.
      if (r) return r;
    }
    for (;;) {
      // The default timeout follows what the limiter learns of the server.
      const remaining = Math.max(0, start + (limit ?? limiter.maxWaitMs) - Date.now());
      const { result: r, windowMs } =
        block && limiter.backend !== 'lua'
          ? await this._block(n, remaining, signal)
          : await this._reserve(n, remaining).then(({ reply, windowMs }) => ({
              result: resultOf(reply),
              windowMs,
            }));
      if (r.allowed) {
        // Reserved (the timer mode, or the server's max-blocked was reached):
        // the tokens are ours once this wait is over.
        if (r.retryAfterMs > 0) await waitReserved(r.retryAfterMs, signal, () => this.refund(r.granted));
        return r;
      }
      if (r.never || r.retryAfterMs > remaining) throw new RateLimited(this.key, r);
      await pause(r.retryAfterMs - windowMs, signal);
    }
  }

  /**
   * TB.CONSUME ... BLOCK on a dedicated connection (RESERVE and a timer if
   * the server turns out to have no module).
   * @internal
   * @param {Amount} n
   * @param {number} waitMs
   * @param {AbortSignal} [signal]
   * @returns {Promise<{ result: Result, windowMs: number }>}
   */
  async _block(n, waitMs, signal) {
    const limiter = this.limiter;
    const conn = await limiter._lease();
    let broken = false;
    const done = this._reserve(n, waitMs, conn, 'BLOCK').then(
      ({ reply, windowMs }) => ({ result: resultOf(reply), windowMs }),
      (e) => {
        broken = !(e instanceof CommandError);
        if (limiter.backend === 'lua') {
          // Detected just now: a script cannot block.
          return this._reserve(n, waitMs).then(({ reply, windowMs }) => ({ result: resultOf(reply), windowMs }));
        }
        throw e;
      },
    );
    const settled = done.finally(() => limiter._release(conn, broken));
    if (!signal) return settled;
    /** @type {Promise<{ result: Result, windowMs: number }>} */
    const aborted = new Promise((resolve, reject) => {
      const onAbort = () => {
        reject(signal.reason);
        // The server answers at the reserved time (or at once if it denied):
        // give back what it reserved for this call when that is known.
        settled.then(({ result }) => (result.granted > 0 ? this.refund(result.granted) : null)).catch(() => {});
      };
      signal.addEventListener('abort', onAbort, { once: true });
      settled.then(
        (v) => {
          signal.removeEventListener('abort', onAbort);
          resolve(v);
        },
        (e) => {
          signal.removeEventListener('abort', onAbort);
          reject(e);
        },
      );
    });
    return aborted;
  }

  /**
   * Gives back `n` tokens (never above capacity): reserve an estimate,
   * refund the unused part. Returns the whole tokens now in the bucket, or
   * null for a missing key (a full bucket).
   * @param {Amount} n
   * @returns {Promise<number | null>}
   */
  async refund(n) {
    const reply = await this.limiter._run(this.limiter._conn, 'TB.REFUND', [this.key], [amountArg(n)]);
    return reply === null ? null : int(reply);
  }

  /**
   * Takes a lease of `n` tokens (TB.CONSUME ... LEASE ttlMs [KEEP]): they
   * come back on `release(result.leaseId)`, or `ttlMs` later if the holder
   * vanishes; with `keep` (a token estimate, probably spent by then) an
   * expired lease stays charged instead. A lease is never reserved: a denial
   * is tried again, backing off from 10 ms to 500 ms (a release may come
   * before the wait the server names), until `timeoutMs` (default: until
   * granted or never possible); then {@link RateLimited}. An aborted
   * `signal` throws its reason; a lease granted meanwhile is released.
   *
   * `block: true` waits on the server instead (TB.CONSUME ... LEASE ttl
   * BLOCK ms, module only), on a connection the limiter duplicates for it:
   * the server queues the call, first come first served, and answers it
   * when the lease is granted: one call per grant. On the Lua fallback (or
   * a module without it) it polls as above.
   *
   * `flow` and `weight` (see {@link TokenBucket#acquire}) make the call
   * wait on the server in its flow's queue, as `block: true` does (with or
   * without it): weighted fair share across flows. Ignored on the Lua
   * fallback, which polls.
   * @param {Amount} [n]
   * @param {LeaseOptions & KeepOption} [options]
   * @returns {Promise<Result>}
   */
  async lease(n = 1, { ttlMs, timeoutMs, signal, keep = false, block = false, flow, weight } = /** @type {LeaseOptions & KeepOption} */ ({})) {
    const lease = ['LEASE', String(leaseTtl(ttlMs)), ...(keep ? ['KEEP'] : [])];
    const queued = flowArgs(flow, weight);
    const deadline = timeoutMs === undefined ? null : Date.now() + waitArg(timeoutMs, 'timeoutMs');
    if ((block || queued.length > 0) && this.limiter.backend !== 'lua') {
      const r = await blockLease(
        this.limiter,
        (conn, w) =>
          this.limiter._run(conn, 'TB.CONSUME', [this.key], this._args(n, ...lease, 'BLOCK', String(w), ...queued)),
        resultOf,
        this.key,
        deadline,
        signal,
        (g) => (g.leaseId ? this.release(g.leaseId) : null),
      );
      if (r) return r;
    }
    const args = this._args(n, ...lease);
    return pollLease(
      () => this.limiter._run(this.limiter._conn, 'TB.CONSUME', [this.key], args).then(resultOf),
      describeKey(this.key),
      deadline,
      signal,
      (r) => this.release(r.leaseId ?? 0),
    );
  }

  /**
   * Runs `fn(lease)` holding a lease of `n` tokens (a {@link Lease}; with
   * `keep`, an estimate, else a slot), with the failure rules of
   * {@link Limiter#withLeases}: when `fn` returns, the lease is released, or
   * settled to `lease.used` (or to `used` of a returned `{ used }`); when it
   * throws a {@link NotSentError} (or an error `returnOn` accepts) it is
   * released; when it throws anything else, an estimate is settled at `n`
   * (kept charged) and a slot stays held until its TTL.
   * @template T
   * @param {Amount} n
   * @param {WithLeaseOptions & KeepOption} options
   * @param {(lease: Lease<Result>) => Promise<T> | T} fn
   * @returns {Promise<T>}
   */
  async withLease(n, options, fn) {
    const { returnOn, ...rest } = options ?? {};
    const r = await this.lease(n, rest);
    return runLeased(new Lease([{ bucket: this, n, kind: rest.keep ? 'estimate' : 'slot' }], r), fn, returnOn);
  }

  /**
   * TB.RELEASE: gives a lease's tokens back (never above capacity). Returns
   * the whole tokens that went back (0 when the bucket was full already), or
   * null when the lease is not held (released already, expired): a retried
   * release does nothing.
   * @param {Amount} leaseId
   * @returns {Promise<number | null>}
   */
  async release(leaseId) {
    const reply = await this.limiter._run(this.limiter._conn, 'TB.RELEASE', [this.key], [amountArg(leaseId, 'leaseId')]);
    return reply === null ? null : int(reply);
  }

  /**
   * TB.RELEASE ... USED: settles a lease to the `used` tokens: the rest
   * comes back, an overrun is charged (into debt: later callers wait).
   * Returns the whole tokens that went back after the cap at capacity
   * (negative: the overrun charged), or null when the
   * lease was settled or released already, or expired: a retried settle
   * never applies twice.
   * @param {Amount} leaseId
   * @param {Amount} used
   * @returns {Promise<number | null>}
   */
  async settle(leaseId, used) {
    const args = [amountArg(leaseId, 'leaseId'), 'USED', amountArg(used, 'used')];
    const reply = await this.limiter._run(this.limiter._conn, 'TB.RELEASE', [this.key], args);
    return reply === null ? null : int(reply);
  }

  /**
   * The bucket as of now, or null for a missing key (a full bucket).
   * @returns {Promise<BucketInfo | null>}
   */
  async info() {
    const reply = await this.limiter._run(this.limiter._conn, 'TB.INFO', [this.key], []);
    return reply === null ? null : BucketInfo.fromReply(/** @type {unknown[]} */ (reply));
  }
}

/**
 * TB.CONSUME's reply (an array) as a Result.
 * @param {unknown} reply
 * @returns {Result}
 */
function resultOf(reply) {
  return Result.fromReply(/** @type {unknown[]} */ (reply));
}

// ---------------------------------------------------------------------------
// Types (JSDoc). At the end of the file: TypeScript 7's declaration emit
// gives a @typedef's comment to the statement after it, not to the type
// (microsoft/TypeScript#63958), so here it goes to no statement.
// ---------------------------------------------------------------------------

/** @import { Connection } from './connection.js' */
/** @import { LeasedPart } from './leases.js' */

/** Which implementation answers: the native module or the Lua script. @typedef {'module' | 'lua'} Backend */
/** A rate: `'10'`, `'0.5'`, `'100/m'`, `'1e-3'`, or a non-negative number. @typedef {string | number} Rate */
/** A token count: an integer from 0 to 2^53. @typedef {number | bigint} Amount */
/** A key: a string, or a Buffer for binary keys. @typedef {string | Buffer} Key */
/**
 * A connected client of node-redis 4+ (`createClient`, `createCluster`) or
 * ioredis 5+ (`Redis`, `Cluster`). Typed loosely so that every version of
 * both libraries fits; the limiter checks the object at run time.
 * @typedef {object} RedisClientLike
 */
/** A flow with calls waiting on a bucket (`BucketInfo.flows`). @typedef {import('./results.js').FlowInfo} FlowInfo */

/**
 * @typedef {Object} LimiterOptions
 * @property {Backend | 'auto'} [backend] `'auto'` (default): the module when the server has it, else the Lua fallback.
 * @property {number} [maxWaitMs] The server's `tb.max-wait-ms` when known (default: learned, assumed 60000 until then).
 */

/**
 * @typedef {Object} ReserveOptions
 * @property {number} [maxWaitMs] Reserve only if the tokens are due within this many ms (default: the server's longest wait).
 */

/**
 * Fair share under saturation: the flow a waiting call belongs to (a
 * tenant, a priority class) and its weight. The call waits on the server in
 * its flow's queue (BLOCK ms FLOW name [WEIGHT w], module only, on a
 * dedicated connection); while several flows wait on a bucket, grants go to
 * them in proportion to their weights, first come first served within a
 * flow. Ignored on the Lua fallback (it polls: no fair share there).
 * @typedef {Object} FlowOptions
 * @property {string | Buffer} [flow] The flow's name: 1 to 128 bytes (RangeError with the server's error line otherwise).
 * @property {number} [weight] The flow's weight: an integer from 1 to 1000000 (default 1); another needs `flow`.
 */

/**
 * @typedef {Object} WaitOptions
 * @property {number} [timeoutMs] Give up (RateLimited) if the tokens are not due within this many ms (default: the server's longest wait).
 * @property {AbortSignal} [signal] Aborting ends the wait with the signal's reason and gives back what was reserved.
 * @property {boolean} [block] Let the server hold the reply (BLOCK, module only) on a connection the limiter duplicates.
 */
/** @typedef {FlowOptions & WaitOptions} AcquireOptions */

/**
 * `ATMOST [MIN chunk]`: a partial grant, of at least `chunk` (or all of n when smaller).
 * @typedef {Object} AtMostOptions
 * @property {boolean} [atmost] Take as many whole tokens as are there (at least `chunk`).
 * @property {Amount} [chunk] The smallest grant worth having (needs `atmost`); at most the capacity.
 */

/**
 * @typedef {Object} LeaseWaitOptions
 * @property {number} ttlMs How long the lease lasts if never released, in ms (1 to 86400000).
 * @property {number} [timeoutMs] How long to keep trying for it (default: until granted or never possible).
 * @property {AbortSignal} [signal] Aborting ends the wait with the signal's reason; a lease granted meanwhile is given back.
 * @property {boolean} [block] Wait on the server (TB.CONSUME or TB.MCONSUME ... LEASE ... BLOCK ms, module only) on a dedicated connection: first come first served, one call per grant. Polls on the Lua fallback.
 */
/** @typedef {FlowOptions & LeaseWaitOptions} LeaseOptions */

/**
 * @typedef {Object} ReturnOnOption
 * @property {(err: unknown) => boolean} [returnOn] Errors that mean the request never left (besides NotSentError): everything is given back.
 */
/** @typedef {LeaseOptions & ReturnOnOption} WithLeaseOptions */

/**
 * @typedef {Object} KeepOption
 * @property {boolean} [keep] An estimate (TB.CONSUME ... LEASE ttl KEEP): an expired lease stays charged; else a slot, which comes back.
 */

/** `[bucket, n]` taken; `[bucket, n, 'estimate' | 'slot']` lent. @typedef {readonly [TokenBucket, Amount] | readonly [TokenBucket, Amount, 'estimate' | 'slot']} LeasePart */

/**
 * @typedef {Object} BatchOptions
 * @property {number} [holdMs] Give back what is held after this long with no request (default 50).
 * @property {number} [maxHoldMs] Give back what is held at the latest this long after it was taken (default 500).
 */
