// Hot keys: a bucket's tokens handed out locally from batches.

import { setTimeout as sleep } from 'node:timers/promises';

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
    /** Tokens taken from the server and not handed out yet. */
    this.held = 0;
    /** Tokens handed out, batches taken (one call each), tokens given back. */
    this.handedOut = 0;
    this.batches = 0;
    this.givenBack = 0;
    this._takenAt = 0;
    this._lastUse = 0;
    this._closed = false;
    this._pending = null;
    /** @type {ReturnType<typeof setTimeout> | undefined} */
    this._timer = undefined;
  }

  _serve(n) {
    if (this._closed) throw new Error('the batcher is closed');
    if (this.held < n) return false;
    this.held -= n;
    this.handedOut += n;
    this._lastUse = Date.now();
    return true;
  }

  /**
   * Takes `n` tokens: from the batch when it has them (returns null, no
   * call), else with one call that takes a new batch; returns that call's
   * reply (`allowed`: the n tokens were handed out; `retryAfterMs`: when
   * they could be).
   */
  async consume(n = 1) {
    if (!Number.isSafeInteger(n) || n < 1) throw new RangeError('n must be an integer of at least 1');
    if (this._serve(n)) return null;
    while (this._pending) {
      await this._pending.catch(() => {});
      if (this._serve(n)) return null;
    }
    const want = Math.max(this.batch, n) - this.held;
    this._pending = this.bucket.consume(want, { atmost: true, chunk: n - this.held });
    let r;
    try {
      r = await this._pending;
    } finally {
      this._pending = null;
    }
    if (r.allowed && r.granted > 0) {
      this.held += r.granted;
      this.batches += 1;
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

  _due() {
    return Math.min(this._lastUse + this.holdMs, this._takenAt + this.maxHoldMs);
  }

  _schedule() {
    clearTimeout(this._timer);
    if (this.held === 0 || this._closed) return;
    this._timer = setTimeout(() => {
      if (Date.now() >= this._due()) {
        this._giveBack().catch(() => {}); // a lost refund admits less, never more
      } else {
        this._schedule();
      }
    }, Math.max(0, this._due() - Date.now()));
    this._timer.unref?.();
  }

  async _giveBack() {
    const n = this.held;
    this.held = 0;
    if (n > 0) {
      this.givenBack += n;
      await this.bucket.refund(n);
    }
  }
}
