import { DEFAULT_MAX_WAIT_MS } from './catalogue.js';
import { Result, MultiResult, BucketInfo } from './results.js';
import { Batcher } from './batcher.js';
import { Lease } from './leases.js';
export { BucketInfo, MultiResult, Result } from './results.js';
export { CommandError, NotSentError, RateLimited } from './errors.js';
export { Batcher } from './batcher.js';
export { Lease } from './leases.js';
/** Source of the Lua fallback (`tb.lua` in this package). */
export declare const SCRIPT: string;
/** SHA1 of {@link SCRIPT}, as EVALSHA takes it. */
export declare const SCRIPT_SHA1: string;
/** The longest wait the module accepts by default (`tb.max-wait-ms`). */
export { DEFAULT_MAX_WAIT_MS };
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
export declare class Limiter<C extends RedisClientLike = RedisClientLike> {
    /**
     * @param {C} client
     * @param {LimiterOptions} [options]
     */
    constructor(client: C, { backend, maxWaitMs }?: LimiterOptions);
    /** The client passed in, with its own type (never closed by the limiter). */
    get client(): C;
    /** `'module'` or `'lua'`; null until the first command has told (with `'auto'`). */
    get backend(): Backend | null;
    /** The longest wait the server accepts, as far as the limiter knows. */
    get maxWaitMs(): number;
    /**
     * The bucket under `key`, refilling at `rate` tokens/s up to `capacity`.
     * @param {Key} key
     * @param {Rate} rate
     * @param {Amount} capacity
     * @returns {TokenBucket}
     */
    bucket(key: Key, rate: Rate, capacity: Amount): TokenBucket;
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
    execute(name: string, keys: ReadonlyArray<Key>, args: ReadonlyArray<string | number | bigint>): Promise<unknown>;
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
    consumeMany(parts: Iterable<readonly [TokenBucket, Amount]>, { maxWaitMs, atmost, chunk }?: ReserveOptions & AtMostOptions): Promise<MultiResult>;
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
    acquireMany(parts: Iterable<readonly [TokenBucket, Amount]>, { timeoutMs, signal, flow, weight }?: Omit<AcquireOptions, 'block'>): Promise<MultiResult>;
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
    leaseMany(parts: Iterable<LeasePart>, options: LeaseOptions): Promise<Lease<MultiResult>>;
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
    withLeases<T>(parts: Iterable<LeasePart>, options: WithLeaseOptions, fn: (lease: Lease<MultiResult>) => Promise<T> | T): Promise<T>;
    /**
     * Closes the connections the limiter opened for BLOCK (never the client
     * passed in). A BLOCK still waiting fails; its reservation stays taken.
     */
    close(): Promise<void>;
}
/** One bucket: `limiter.bucket('llm:openai', '0.5', 1)`. */
export declare class TokenBucket {
    /** The limiter that sends this bucket's commands. @readonly @type {Limiter} */
    readonly limiter: Limiter;
    /** @readonly @type {Key} */
    readonly key: Key;
    /** The rate as sent (`'0.5'`, `'100/m'`). @readonly @type {string} */
    readonly rate: string;
    /** Burst size: the most tokens the bucket holds. @readonly @type {number} */
    readonly capacity: number;
    /**
     * @param {Limiter} limiter
     * @param {Key} key
     * @param {Rate} rate
     * @param {Amount} capacity
     */
    constructor(limiter: Limiter, key: Key, rate: Rate, capacity: Amount);
    /**
     * Takes `n` tokens now or none (`atmost`: as many whole tokens as are
     * there, at least `chunk` (default 1, or all of `n` when smaller), and a
     * denial's wait is the wait for `chunk`; `granted` says how many). `n = 0`
     * is a peek.
     * @param {Amount} [n]
     * @param {AtMostOptions} [options]
     * @returns {Promise<Result>}
     */
    consume(n?: Amount, { atmost, chunk }?: AtMostOptions): Promise<Result>;
    /**
     * Whether a request would be served now; changes nothing.
     * @returns {Promise<Result>}
     */
    peek(): Promise<Result>;
    /**
     * Hands this bucket's tokens out locally from batches of up to `batch`
     * taken in one call, for a hot key (see {@link Batcher}).
     * @param {number} batch
     * @param {BatchOptions} [options]
     * @returns {Batcher}
     */
    batched(batch: number, options?: BatchOptions): Batcher;
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
    reserve(n?: Amount, { maxWaitMs }?: ReserveOptions): Promise<Result>;
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
    acquire(n?: Amount, { timeoutMs, signal, block, flow, weight }?: AcquireOptions): Promise<Result>;
    /**
     * Gives back `n` tokens (never above capacity): reserve an estimate,
     * refund the unused part. Returns the whole tokens now in the bucket, or
     * null for a missing key (a full bucket).
     * @param {Amount} n
     * @returns {Promise<number | null>}
     */
    refund(n: Amount): Promise<number | null>;
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
    lease(n?: Amount, { ttlMs, timeoutMs, signal, keep, block, flow, weight }?: LeaseOptions & KeepOption): Promise<Result>;
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
    withLease<T>(n: Amount, options: WithLeaseOptions & KeepOption, fn: (lease: Lease<Result>) => Promise<T> | T): Promise<T>;
    /**
     * TB.RELEASE: gives a lease's tokens back (never above capacity). Returns
     * the whole tokens that went back (0 when the bucket was full already), or
     * null when the lease is not held (released already, expired): a retried
     * release does nothing.
     * @param {Amount} leaseId
     * @returns {Promise<number | null>}
     */
    release(leaseId: Amount): Promise<number | null>;
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
    settle(leaseId: Amount, used: Amount): Promise<number | null>;
    /**
     * The bucket as of now, or null for a missing key (a full bucket).
     * @returns {Promise<BucketInfo | null>}
     */
    info(): Promise<BucketInfo | null>;
}
export type Backend = 'module' | 'lua';
export type Rate = string | number;
export type Amount = number | bigint;
export type Key = string | Buffer;
export type RedisClientLike = object;
export type FlowInfo = import('./results.js').FlowInfo;
export type LimiterOptions = {
    /**
     * `'auto'` (default): the module when the server has it, else the Lua fallback.
     */
    backend?: Backend | 'auto';
    /**
     * The server's `tb.max-wait-ms` when known (default: learned, assumed 60000 until then).
     */
    maxWaitMs?: number;
};
export type ReserveOptions = {
    /**
     * Reserve only if the tokens are due within this many ms (default: the server's longest wait).
     */
    maxWaitMs?: number;
};
export type FlowOptions = {
    /**
     * The flow's name: 1 to 128 bytes (RangeError with the server's error line otherwise).
     */
    flow?: string | Buffer;
    /**
     * The flow's weight: an integer from 1 to 1000000 (default 1); another needs `flow`.
     */
    weight?: number;
};
export type WaitOptions = {
    /**
     * Give up (RateLimited) if the tokens are not due within this many ms (default: the server's longest wait).
     */
    timeoutMs?: number;
    /**
     * Aborting ends the wait with the signal's reason and gives back what was reserved.
     */
    signal?: AbortSignal;
    /**
     * Let the server hold the reply (BLOCK, module only) on a connection the limiter duplicates.
     */
    block?: boolean;
};
export type AcquireOptions = FlowOptions & WaitOptions;
export type AtMostOptions = {
    /**
     * Take as many whole tokens as are there (at least `chunk`).
     */
    atmost?: boolean;
    /**
     * The smallest grant worth having (needs `atmost`); at most the capacity.
     */
    chunk?: Amount;
};
export type LeaseWaitOptions = {
    /**
     * How long the lease lasts if never released, in ms (1 to 86400000).
     */
    ttlMs: number;
    /**
     * How long to keep trying for it (default: until granted or never possible).
     */
    timeoutMs?: number;
    /**
     * Aborting ends the wait with the signal's reason; a lease granted meanwhile is given back.
     */
    signal?: AbortSignal;
    /**
     * Wait on the server (TB.CONSUME or TB.MCONSUME ... LEASE ... BLOCK ms, module only) on a dedicated connection: first come first served, one call per grant. Polls on the Lua fallback.
     */
    block?: boolean;
};
export type LeaseOptions = FlowOptions & LeaseWaitOptions;
export type ReturnOnOption = {
    /**
     * Errors that mean the request never left (besides NotSentError): everything is given back.
     */
    returnOn?: (err: unknown) => boolean;
};
export type WithLeaseOptions = LeaseOptions & ReturnOnOption;
export type KeepOption = {
    /**
     * An estimate (TB.CONSUME ... LEASE ttl KEEP): an expired lease stays charged; else a slot, which comes back.
     */
    keep?: boolean;
};
export type LeasePart = readonly [TokenBucket, Amount] | readonly [TokenBucket, Amount, 'estimate' | 'slot'];
export type BatchOptions = {
    /**
     * Give back what is held after this long with no request (default 50).
     */
    holdMs?: number;
    /**
     * Give back what is held at the latest this long after it was taken (default 500).
     */
    maxHoldMs?: number;
};
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
