import type { BatchOptions, TokenBucket } from './index.js';
import type { Result } from './results.js';
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
export declare class Batcher {
    /** @readonly @type {TokenBucket} */
    readonly bucket: TokenBucket;
    /** The most tokens one call takes. @readonly @type {number} */
    readonly batch: number;
    /** Idle time after which what is held goes back. @readonly @type {number} */
    readonly holdMs: number;
    /** The longest a batch is held after it was taken. @readonly @type {number} */
    readonly maxHoldMs: number;
    /**
     * @param {TokenBucket} bucket
     * @param {number} batch
     * @param {BatchOptions} [options]
     */
    constructor(bucket: TokenBucket, batch: number, { holdMs, maxHoldMs }?: BatchOptions);
    /** Tokens taken from the server and not handed out yet. */
    get held(): number;
    /** Tokens handed out. */
    get handedOut(): number;
    /** Batches taken (one call each). */
    get batches(): number;
    /** Tokens given back (TB.REFUND). */
    get givenBack(): number;
    /**
     * Takes `n` tokens: from the batch when it has them (returns null, no
     * call), else with one call that takes a new batch; returns that call's
     * reply (`allowed`: the n tokens were handed out; `retryAfterMs`: when
     * they could be).
     * @param {number} [n]
     * @returns {Promise<Result | null>}
     */
    consume(n?: number): Promise<Result | null>;
    /**
     * Takes `n` tokens, sleeping between calls; RateLimited when never or past `timeoutMs`.
     * @param {number} [n]
     * @param {{ timeoutMs?: number }} [options]
     * @returns {Promise<void>}
     */
    acquire(n?: number, { timeoutMs }?: {
        timeoutMs?: number;
    }): Promise<void>;
    /** Gives back what is held and stops the timer. Idempotent. */
    close(): Promise<void>;
}
