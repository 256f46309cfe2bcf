import type { Amount, Key, Limiter, TokenBucket } from './index.js';
import type { Connection } from './connection.js';
import type { MultiResult, Result } from './results.js';
export type LeasedPart = {
    bucket: TokenBucket;
    n: Amount;
    kind: 'taken' | 'estimate' | 'slot';
};
export type RunOptions = {
    returnOn?: (err: unknown) => boolean;
};
/**
 * A lease TTL in ms, checked.
 * @param {number | undefined} ttlMs
 * @returns {number}
 */
export declare function leaseTtl(ttlMs: number | undefined): number;
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
export declare function blockLease<R extends Result | MultiResult>(limiter: Limiter, send: (conn: Connection, waitMs: number) => Promise<unknown>, parse: (reply: unknown) => R, label: Key, deadline: number | null, signal: AbortSignal | undefined, undo: (granted: R) => unknown): Promise<R | null>;
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
export declare function pollLease<R extends Result | MultiResult>(call: () => Promise<R>, label: Key, deadline: number | null, signal: AbortSignal | undefined, undo: (granted: R) => unknown): Promise<R>;
/**
 * Runs `fn(lease)`, then ends the lease by how `fn` ended (see Limiter#withLeases).
 * @template {Result | MultiResult} R
 * @template T
 * @param {Lease<R>} lease
 * @param {(lease: Lease<R>) => Promise<T> | T} fn
 * @param {((err: unknown) => boolean) | undefined} returnOn
 * @returns {Promise<T>}
 */
export declare function runLeased<R extends Result | MultiResult, T>(lease: Lease<R>, fn: (lease: Lease<R>) => Promise<T> | T, returnOn: ((err: unknown) => boolean) | undefined): Promise<T>;
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
export declare class Lease<R extends Result | MultiResult = Result | MultiResult> {
    /** The grant: a Result (one bucket) or a MultiResult. @readonly @type {R} */
    readonly result: R;
    /** Lease id of each part, 0 for a part taken. @readonly @type {ReadonlyArray<number>} */
    readonly leaseIds: ReadonlyArray<number>;
    /** Tokens used, to settle the estimates to on a normal exit. @type {Amount | undefined} */
    used: Amount | undefined;
    /**
     * @param {ReadonlyArray<LeasedPart>} parts
     * @param {R} result
     */
    constructor(parts: ReadonlyArray<LeasedPart>, result: R);
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
    run<T>(fn: (lease: this) => Promise<T> | T, { returnOn }?: RunOptions): Promise<T>;
    /** The lease id of the first leased part (the only one of `bucket.lease`). */
    get leaseId(): number;
    /** A normal exit: slots released, estimates settled to `used` (released if unset). */
    done(): Promise<void>;
    /** The call failed and may have been sent: estimates kept charged, slots held until their TTL. */
    failed(): Promise<void>;
    /** The request never left: every lease released, the parts taken refunded. */
    giveBack(): Promise<void>;
}
