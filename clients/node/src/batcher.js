// Hot keys: a bucket's tokens handed out locally from batches.

import { setTimeout as sleep } from 'node:timers/promises';

/** @import { BatchOptions, TokenBucket } from './index.js' */
/** @import { Result } from './results.js' */

import { waitArg } from './args.js';
import { RateLimited } from './errors.js';

/**
 * Hot keys: a bucket's tokens handed out locally from batches of up to
 * `batch` taken in one call (`TB.CONSUME ... ATMOST batch MIN n`), made by
 * `bucket.batched(batch, { holdMs, maxHoldMs })`. Every token handed out was
 * granted by the server, so the fleet's bound stays exact. What is held and
 * not handed out goes back (TB.REFUND) after `holdMs` with no request, on
 * `close()`, and at the latest `maxHoldMs` after it was taken: hoarding keeps
 * tokens from other workers for at most `maxHoldMs`. One call at a time: a
 * request that finds the batch empty while a call is on its way waits for it.
 */
export class Batcher {
  /** @readonly @type {TokenBucket} */
  bucket;
  /** The most tokens one call takes. @readonly @type {number} */
  batch;
  /** Idle time after which what is held goes back. @readonly @type {number} */
  holdMs;
  /** The longest a batch is held after it was taken. @readonly @type {number} */
  maxHoldMs;
  /** @internal */
  _held = 0;
  /** @internal */
  _handedOut = 0;
  /** @internal */
  _batches = 0;
  /** @internal */
  _givenBack = 0;
  /** @internal */
  _takenAt = 0;
  /** @internal */
  _lastUse = 0;
  /** @internal */
  _closed = false;
  /** The call taking a batch, while it runs. @internal @type {Promise<Result> | null} */
  _pending = null;
  /** @internal @type {ReturnType<typeof setTimeout> | undefined} */
  _timer = undefined;

  /**
   * @param {TokenBucket} bucket
   * @param {number} batch
   * @param {BatchOptions} [options]
   */
  constructor(bucket, batch, { holdMs = 50, maxHoldMs = 500 } = {}) {
    if (!Number.isSafeInteger(batch) || batch < 1) throw new RangeError('batch must be an integer of at least 1');
    if (batch > bucket.capacity) {
      throw new RangeError(`batch (${batch}) must not exceed the bucket's capacity (${bucket.capacity})`);
    }
    if (!(holdMs >= 0 && holdMs <= maxHoldMs)) throw new RangeError('need 0 <= holdMs <= maxHoldMs');
    this.bucket = bucket;
    this.batch = batch;
    this.holdMs = holdMs;
    this.maxHoldMs = maxHoldMs;
  }

  /** Tokens taken from the server and not handed out yet. */
  get held() {
    return this._held;
  }

  /** Tokens handed out. */
  get handedOut() {
    return this._handedOut;
  }

  /** Batches taken (one call each). */
  get batches() {
    return this._batches;
  }

  /** Tokens given back (TB.REFUND). */
  get givenBack() {
    return this._givenBack;
  }

  /**
   * Hands out `n` tokens from the batch if it holds them.
   * @internal
   * @param {number} n
   * @returns {boolean}
   */
  _serve(n) {
    if (this._closed) throw new Error('the batcher is closed');
    if (this._held < n) return false;
    this._held -= n;
    this._handedOut += n;
    this._lastUse = Date.now();
    return true;
  }

  /**
   * Takes `n` tokens: from the batch when it has them (returns null, no
   * call), else with one call that takes a new batch; returns that call's
   * reply (`allowed`: the n tokens were handed out; `retryAfterMs`: when
   * they could be).
   * @param {number} [n]
   * @returns {Promise<Result | null>}
   */
  async consume(n = 1) {
    if (!Number.isSafeInteger(n) || n < 1) throw new RangeError('n must be an integer of at least 1');
    if (this._serve(n)) return null;
    while (this._pending) {
      await this._pending.catch(() => {});
      if (this._serve(n)) return null;
    }
    const want = Math.max(this.batch, n) - this._held;
    this._pending = this.bucket.consume(want, { atmost: true, chunk: n - this._held });
    let r;
    try {
      r = await this._pending;
    } finally {
      this._pending = null;
    }
    if (r.allowed && r.granted > 0) {
      this._held += r.granted;
      this._batches += 1;
      this._takenAt = Date.now();
      this._serve(n);
      this._schedule();
    }
    return r;
  }

  /**
   * Takes `n` tokens, sleeping between calls; RateLimited when never or past `timeoutMs`.
   * @param {number} [n]
   * @param {{ timeoutMs?: number }} [options]
   * @returns {Promise<void>}
   */
  async acquire(n = 1, { timeoutMs } = {}) {
    const deadline = timeoutMs === undefined ? null : Date.now() + waitArg(timeoutMs, 'timeoutMs');
    for (;;) {
      const r = await this.consume(n);
      if (r === null || r.allowed) return;
      if (r.never || (deadline !== null && Date.now() + r.retryAfterMs > deadline)) {
        throw new RateLimited(this.bucket.key, r);
      }
      await sleep(r.retryAfterMs);
    }
  }

  /** Gives back what is held and stops the timer. Idempotent. */
  async close() {
    this._closed = true;
    clearTimeout(this._timer);
    await this._pending?.catch(() => {});
    await this._giveBack();
  }

  /**
   * When what is held goes back (Date.now() time).
   * @internal
   * @returns {number}
   */
  _due() {
    return Math.min(this._lastUse + this.holdMs, this._takenAt + this.maxHoldMs);
  }

  /**
   * Sets the timer that gives back what is held.
   * @internal
   */
  _schedule() {
    clearTimeout(this._timer);
    if (this._held === 0 || this._closed) return;
    this._timer = setTimeout(() => {
      if (Date.now() >= this._due()) {
        this._giveBack().catch(() => {}); // a lost refund admits less, never more
      } else {
        this._schedule();
      }
    }, Math.max(0, this._due() - Date.now()));
    this._timer.unref?.();
  }

  /**
   * Gives back what is held (TB.REFUND).
   * @internal
   */
  async _giveBack() {
    const n = this._held;
    this._held = 0;
    if (n > 0) {
      this._givenBack += n;
      await this.bucket.refund(n);
    }
  }
}
