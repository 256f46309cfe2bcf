// Leases: waiting for them (on the server, or polling), holding them while
// a body runs, and ending them by how it ended.

/** @import { Amount, Key, Limiter, TokenBucket } from './index.js' */
/** @import { Connection } from './connection.js' */
/** @import { MultiResult, Result } from './results.js' */

/**
 * One part of a {@link Lease}: `n` tokens of `bucket`, taken (refunded when
 * the request never left), or lent as an estimate (KEEP) or a slot.
 * @typedef {{ bucket: TokenBucket, n: Amount, kind: 'taken' | 'estimate' | 'slot' }} LeasedPart
 */

/**
 * Ends a lease by how its body ended.
 * @typedef {{ returnOn?: (err: unknown) => boolean }} RunOptions
 */

import { pause, waitArg } from './args.js';
import { CommandError, RateLimited, isNotSent } from './errors.js';

/**
 * A lease TTL in ms, checked.
 * @param {number | undefined} ttlMs
 * @returns {number}
 */
export function leaseTtl(ttlMs) {
  const ttl = waitArg(/** @type {number} */ (ttlMs), 'ttlMs');
  if (ttl < 1) throw new RangeError('ttlMs must be at least 1');
  return ttl;
}

/**
 * Waits in the server's queue of a bucket (BLOCK with LEASE, or with FLOW)
 * on a dedicated connection of `limiter`, until `deadline`: `send(conn,
 * waitMs)` runs the command, `parse` reads its reply, `undo(granted)` gives
 * back a grant that arrived after `signal` aborted (an abort closes the
 * connection: the server drops a call still queued). Returns null when the
 * server cannot wait so (the Lua fallback, or a module without BLOCK with
 * LEASE): the caller polls.
 * @template {Result | MultiResult} R
 * @param {Limiter} limiter
 * @param {(conn: Connection, waitMs: number) => Promise<unknown>} send
 * @param {(reply: unknown) => R} parse
 * @param {Key} label
 * @param {number | null} deadline
 * @param {AbortSignal | undefined} signal
 * @param {(granted: R) => unknown} undo
 * @returns {Promise<R | null>}
 */
export async function blockLease(limiter, send, parse, label, deadline, signal, undo) {
  let backoff = 10;
  for (;;) {
    signal?.throwIfAborted();
    const left = deadline === null ? limiter.maxWaitMs : Math.max(0, deadline - Date.now());
    const started = Date.now();
    let asked = left;
    const conn = await limiter._lease();
    let broken = false;
    // Aborted: close the connection, so the server drops the call from the
    // queue at once (a queued call takes nothing until granted); a grant
    // already on its way is given back by `undo`.
    const leave = () => {
      broken = true;
      Promise.resolve()
        .then(() => conn.close?.())
        .catch(() => {});
    };
    signal?.addEventListener('abort', leave, { once: true });
    const done = limiter
      ._withWait(left, (w) => send(conn, w))
      .then(
        ({ reply, windowMs }) => {
          asked = windowMs;
          return parse(reply);
        },
        (e) => {
          broken ||= !(e instanceof CommandError);
          if (limiter.backend === 'lua' || /LEASE cannot be combined/.test(String(e?.message))) return null;
          throw e;
        },
      )
      .finally(() => {
        signal?.removeEventListener('abort', leave);
        limiter._release(conn, broken);
      });
    const r = await (signal ? abortable(done, signal, (g) => (g ? undo(g) : null)) : done);
    if (r === null || r.allowed) return r;
    if (r.never || (deadline !== null && Date.now() >= deadline)) throw new RateLimited(label, r);
    if (Date.now() - started < 0.9 * asked) {
      // Answered without waiting (the server's tb.max-blocked or memory
      // bound): back off as polling does.
      const rest = deadline === null ? Infinity : deadline - Date.now();
      await pause(Math.max(1, Math.min(backoff, r.retryAfterMs, rest)), signal);
      backoff = Math.min(backoff * 2, 500);
    }
  }
}

/**
 * Runs `call()` until it grants, backing off from 10 ms to 500 ms (never
 * past the wait the server names, nor past `deadline`, a Date.now() time or
 * null for none); then
 * {@link RateLimited}. A grant that arrives after `signal` aborted is given
 * back (`undo`) and the reason thrown.
 * @template {Result | MultiResult} R
 * @param {() => Promise<R>} call
 * @param {Key} label
 * @param {number | null} deadline
 * @param {AbortSignal | undefined} signal
 * @param {(granted: R) => unknown} undo
 * @returns {Promise<R>}
 */
export async function pollLease(call, label, deadline, signal, undo) {
  let backoff = 10;
  for (;;) {
    signal?.throwIfAborted();
    const r = await call();
    if (r.allowed) {
      if (signal?.aborted) {
        await Promise.resolve(undo(r)).catch(() => {});
        throw signal.reason;
      }
      return r;
    }
    const left = deadline === null ? Infinity : deadline - Date.now();
    if (r.never || left <= 0) throw new RateLimited(label, r);
    await pause(Math.max(1, Math.min(backoff, r.retryAfterMs, left)), signal);
    backoff = Math.min(backoff * 2, 500);
  }
}

/**
 * Runs `fn(lease)`, then ends the lease by how `fn` ended (see Limiter#withLeases).
 * @template {Result | MultiResult} R
 * @template T
 * @param {Lease<R>} lease
 * @param {(lease: Lease<R>) => Promise<T> | T} fn
 * @param {((err: unknown) => boolean) | undefined} returnOn
 * @returns {Promise<T>}
 */
export function runLeased(lease, fn, returnOn) {
  return lease.run(fn, { returnOn });
}

/**
 * See {@link Lease#run}.
 * @template {Lease} L
 * @template T
 * @param {L} lease
 * @param {(lease: L) => Promise<T> | T} fn
 * @param {((err: unknown) => boolean) | undefined} returnOn
 * @returns {Promise<T>}
 */
async function runHeld(lease, fn, returnOn) {
  let out;
  try {
    out = await fn(lease);
  } catch (e) {
    let notSent = isNotSent(e);
    if (!notSent && returnOn) {
      try {
        notSent = Boolean(returnOn(e));
      } catch {
        notSent = false; // a failing predicate cannot say the request was not sent
      }
    }
    // Best effort: the body's error is what the caller sees. A lost call
    // leaves an estimate to its KEEP expiry and a slot to its TTL.
    await (notSent ? lease.giveBack() : lease.failed()).catch(() => {});
    throw e;
  }
  if (lease.used === undefined && out && typeof out === 'object' && 'used' in out) lease.used = /** @type {Amount} */ (out.used);
  await lease.done();
  return out;
}

/**
 * Leases held (from `bucket.lease`/`withLease`, or `limiter.leaseMany`/
 * `withLeases`): `result` is the grant, `leaseIds` the id of each part
 * (0 for a part taken). Set `used` to the tokens the call used: estimates
 * are settled to it on a normal exit. Ending it:
 * - `done()`: slots released, estimates settled to `used` (released if
 *   unset);
 * - `failed()` (the call may have reached the provider): estimates settled
 *   at the estimate, slots left held until their TTL;
 * - `giveBack()` (the request never left): leases released, taken parts
 *   refunded.
 * Only the first of these does anything.
 * @template {Result | MultiResult} [R=Result | MultiResult]
 */
export class Lease {
  /** @internal @type {ReadonlyArray<LeasedPart>} */
  _parts;
  /** The grant: a Result (one bucket) or a MultiResult. @readonly @type {R} */
  result;
  /** Lease id of each part, 0 for a part taken. @readonly @type {ReadonlyArray<number>} */
  leaseIds;
  /** Tokens used, to settle the estimates to on a normal exit. @type {Amount | undefined} */
  used = undefined;
  /** @internal */
  _ended = false;

  /**
   * @param {ReadonlyArray<LeasedPart>} parts
   * @param {R} result
   */
  constructor(parts, result) {
    this._parts = parts;
    this.result = result;
    this.leaseIds = 'leaseIds' in result ? (result.leaseIds ?? []) : [result.leaseId ?? 0];
  }

  /**
   * Runs `fn(this)` and ends the lease by how it ended: returned, `done()`
   * (`used` also from a returned `{ used }`); threw a NotSentError (or an
   * error `returnOn` accepts), `giveBack()`; threw anything else,
   * `failed()`. The body's error is rethrown; a call that fails while
   * ending a failed lease is ignored (the tokens stay taken: the safe side).
   * @template T
   * @param {(lease: this) => Promise<T> | T} fn
   * @param {RunOptions} [options]
   * @returns {Promise<T>}
   */
  run(fn, { returnOn } = {}) {
    return runHeld(this, fn, returnOn);
  }

  /** The lease id of the first leased part (the only one of `bucket.lease`). */
  get leaseId() {
    return this.leaseIds.find((id) => id > 0) ?? 0;
  }

  /**
   * Marks the lease ended; false when it was already.
   * @internal
   * @returns {boolean}
   */
  _end() {
    if (this._ended) return false;
    this._ended = true;
    return true;
  }

  /**
   * Runs `fn` for each part with its lease id, all at once.
   * @internal
   * @param {(part: LeasedPart, id: number) => unknown} fn
   * @returns {Promise<unknown[]>}
   */
  _each(fn) {
    return Promise.all(this._parts.map((p, j) => fn(p, this.leaseIds[j])));
  }

  /** A normal exit: slots released, estimates settled to `used` (released if unset). */
  async done() {
    if (!this._end()) return;
    const single = this._parts.length === 1;
    const used = this.used;
    await this._each(({ bucket, kind }, id) => {
      if (!id) return null;
      const settle = used !== undefined && (kind === 'estimate' || single);
      return settle ? bucket.settle(id, used) : bucket.release(id);
    });
  }

  /** The call failed and may have been sent: estimates kept charged, slots held until their TTL. */
  async failed() {
    if (!this._end()) return;
    await this._each(({ bucket, n, kind }, id) => (id && kind === 'estimate' ? bucket.settle(id, n) : null));
  }

  /** The request never left: every lease released, the parts taken refunded. */
  async giveBack() {
    if (!this._end()) return;
    await this._each(({ bucket, n }, id) => (id ? bucket.release(id) : Number(n) > 0 ? bucket.refund(n) : null));
  }
}

/**
 * `promise`, or `signal`'s reason once it aborts; what the promise gives
 * after an abort goes to `undo` (a lease granted too late is given back).
 * @template V
 * @param {Promise<V>} promise
 * @param {AbortSignal} signal
 * @param {(value: V) => unknown} undo
 * @returns {Promise<V>}
 */
function abortable(promise, signal, undo) {
  return new Promise((resolve, reject) => {
    const onAbort = () => {
      reject(signal.reason);
      promise.then(undo).catch(() => {});
    };
    signal.addEventListener('abort', onAbort, { once: true });
    promise.then(
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
}
