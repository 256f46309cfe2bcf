// Types of tb-limiter (hand-written; the package ships plain JavaScript).

/** Source of the Lua fallback (`tb.lua` in this package). */
export declare const SCRIPT: string;
/** SHA1 of {@link SCRIPT}, as EVALSHA takes it. */
export declare const SCRIPT_SHA1: string;
/** The longest wait the module accepts by default (`tb.max-wait-ms`). */
export declare const DEFAULT_MAX_WAIT_MS: number;

/** Which implementation answers: the native module or the Lua script. */
export type Backend = 'module' | 'lua';

/** A rate: `'10'`, `'0.5'`, `'100/m'`, `'1e-3'`, or a non-negative number. */
export type Rate = string | number;

/** A token count: an integer from 0 to 2^53. */
export type Amount = number | bigint;

/** A key: a string, or a Buffer for binary keys. */
export type Key = string | Buffer;

/**
 * A connected client of node-redis 4+ (`createClient`, `createCluster`) or
 * ioredis 5+ (`Redis`, `Cluster`). Typed loosely so that every version of
 * both libraries fits; the limiter checks the object at run time.
 */
export type RedisClientLike = object;

export interface LimiterOptions {
  /** `'auto'` (default): the module when the server has it, else the Lua fallback. */
  backend?: Backend | 'auto';
  /** The server's `tb.max-wait-ms` when known (default: learned, assumed 60000 until then). */
  maxWaitMs?: number;
}

export interface ReserveOptions {
  /** Reserve only if the tokens are due within this many ms (default: the server's longest wait). */
  maxWaitMs?: number;
}

/**
 * Fair share under saturation: the flow a waiting call belongs to (a
 * tenant, a priority class) and its weight. The call waits on the server in
 * its flow's queue (BLOCK ms FLOW name [WEIGHT w], module only, on a
 * dedicated connection); while several flows wait on a bucket, grants go to
 * them in proportion to their weights, first come first served within a
 * flow. Ignored on the Lua fallback (it polls: no fair share there).
 */
export interface FlowOptions {
  /** The flow's name: 1 to 128 bytes (RangeError with the server's error line otherwise). */
  flow?: string | Buffer;
  /** The flow's weight: an integer from 1 to 1000000 (default 1); another needs `flow`. */
  weight?: number;
}

export interface AcquireOptions extends FlowOptions {
  /** Give up (RateLimited) if the tokens are not due within this many ms (default: the server's longest wait). */
  timeoutMs?: number;
  /** Aborting ends the wait with the signal's reason and gives back what was reserved. */
  signal?: AbortSignal;
  /** Let the server hold the reply (BLOCK, module only) on a connection the limiter duplicates. */
  block?: boolean;
}

/** The reply of TB.CONSUME. A denial carries `retryAfterMs > 0` too: check `allowed`. */
export declare class Result {
  constructor(
    allowed: boolean,
    remaining: number,
    retryAfterMs: number,
    resetAfterMs: number,
    granted: number,
    leaseId?: number | null,
  );
  static fromReply(reply: ReadonlyArray<unknown>): Result;
  /** With LEASE: the lease id (0 when denied); else null. */
  readonly leaseId: number | null;
  readonly allowed: boolean;
  /** Whole tokens left, never negative. */
  readonly remaining: number;
  /** 0 when allowed now; the wait when denied or reserved; -1 when it can never succeed. */
  readonly retryAfterMs: number;
  /** Milliseconds until full; -1 if never (rate 0). */
  readonly resetAfterMs: number;
  /** Tokens taken: n when allowed (fewer with ATMOST), 0 when denied. */
  readonly granted: number;
  /** The request can never succeed (n > capacity, or rate 0 and too few tokens). */
  readonly never: boolean;
  /** `retryAfterMs` in seconds; Infinity for never. */
  readonly retryAfter: number;
  /** The reply as the server sent it. */
  readonly reply: number[];
}

/** `ATMOST [MIN chunk]`: a partial grant, of at least `chunk` (or all of n when smaller). */
export interface AtMostOptions {
  atmost?: boolean;
  /** The smallest grant worth having (needs `atmost`); at most the capacity. */
  chunk?: Amount;
}

/** The reply of TB.MCONSUME. */
export declare class MultiResult {
  /** With LEASE parts: every part's lease id (0 for a part taken, and when denied); else null. */
  readonly leaseIds: ReadonlyArray<number> | null;
  constructor(
    allowed: boolean,
    retryAfterMs: number,
    remaining: number[],
    granted?: number | null,
    leaseIds?: number[] | null,
  );
  /** `leases`: the reply ends with a lease id per part. */
  static fromReply(reply: ReadonlyArray<unknown>, atmost?: boolean, leases?: boolean): MultiResult;
  readonly allowed: boolean;
  readonly retryAfterMs: number;
  /** Whole tokens left in each bucket, in order. */
  readonly remaining: ReadonlyArray<number>;
  /** With `atmost`: the grant of every part asking for the largest n (0 when denied); else null. */
  readonly granted: number | null;
  readonly never: boolean;
  readonly retryAfter: number;
  readonly reply: number[];
}

/** A flow with calls waiting on a bucket (`BucketInfo.flows`). */
export interface FlowInfo {
  /** The flow's name, decoded as UTF-8 (`''`: the default flow of calls queued without FLOW). */
  readonly name: string;
  readonly weight: number;
  /** Calls of this flow waiting on the bucket. */
  readonly waiting: number;
}

/** The reply of TB.INFO as numbers (and the exact decimals). */
export declare class BucketInfo {
  static fromReply(reply: ReadonlyArray<unknown>): BucketInfo;
  /** Tokens now; negative while reservations are pending. */
  readonly tokens: number;
  /** `tokens` as the server's exact decimal string. */
  readonly tokensExact: string;
  readonly capacity: number;
  /** Tokens per second. */
  readonly rate: number;
  /** `rate` as the server's decimal string. */
  readonly rateExact: string;
  readonly updatedAtMs: number;
  /** -1 if never full again (rate 0). */
  readonly resetAfterMs: number;
  /** -1 without expiry. */
  readonly ttlMs: number;
  /** Calls queued on the bucket now; 0 when none. */
  readonly waiting: number;
  /** The flows with calls queued, in the order they will be served next; empty when none. */
  readonly flows: ReadonlyArray<FlowInfo>;
}

/** `acquire`/`acquireMany` could not have the tokens within the timeout (or ever); nothing was taken. */
export declare class RateLimited extends Error {
  constructor(key: Key, result: Result | MultiResult);
  readonly name: 'RateLimited';
  readonly key: Key;
  readonly result: Result | MultiResult;
  /** Milliseconds until the same request would succeed; -1 for never. */
  readonly retryAfterMs: number;
}

/** The server refused a command (message is the server's; `cause` the library's error). */
export declare class CommandError extends Error {
  constructor(command: string, cause: unknown);
  readonly name: 'CommandError';
  readonly command: string;
}

export declare class Limiter<C extends RedisClientLike = RedisClientLike> {
  constructor(client: C, options?: LimiterOptions);
  /** The client passed in, with its own type (never closed by the limiter). */
  readonly client: C;
  /** Null until the first command has told (with `'auto'`). */
  readonly backend: Backend | null;
  /** The longest wait the server accepts, as far as the limiter knows. */
  readonly maxWaitMs: number;
  bucket(key: Key, rate: Rate, capacity: Amount): TokenBucket;
  /** One command (`TB.CONSUME`, `TB.MCONSUME`, `TB.REFUND`, `TB.INFO`), raw reply. */
  execute(name: string, keys: ReadonlyArray<Key>, args: ReadonlyArray<string | number | bigint>): Promise<unknown>;
  /**
   * TB.MCONSUME: all or nothing; with `maxWaitMs`, a reservation; with
   * `atmost` (and `chunk`), one shared partial grant of at least `chunk`.
   */
  consumeMany(
    parts: Iterable<readonly [TokenBucket, Amount]>,
    options?: ReserveOptions & AtMostOptions,
  ): Promise<MultiResult>;
  /**
   * TB.MCONSUME with leases, all or nothing: `[bucket, n]` taken,
   * `[bucket, n, 'estimate']` lent with KEEP (an expired one stays charged),
   * `[bucket, n, 'slot']` lent (an expired one comes back).
   */
  leaseMany(parts: Iterable<LeasePart>, options: LeaseOptions): Promise<Lease<MultiResult>>;
  /**
   * Runs `fn` holding `leaseMany`'s leases. Returned: slots released,
   * estimates settled to `lease.used` (released if unset). Threw a
   * NotSentError (or an error `returnOn` accepts): everything given back.
   * Threw anything else: estimates kept charged, slots held until their TTL.
   */
  withLeases<T>(
    parts: Iterable<LeasePart>,
    options: WithLeaseOptions,
    fn: (lease: Lease<MultiResult>) => Promise<T> | T,
  ): Promise<T>;
  /** Takes every part at once, waiting up to `timeoutMs`. */
  acquireMany(
    parts: Iterable<readonly [TokenBucket, Amount]>,
    options?: Omit<AcquireOptions, 'block'>,
  ): Promise<MultiResult>;
  /** Closes the connections the limiter opened for BLOCK (never the client passed in). */
  close(): Promise<void>;
}

export declare class TokenBucket {
  constructor(limiter: Limiter<any>, key: Key, rate: Rate, capacity: Amount);
  readonly limiter: Limiter<any>;
  readonly key: Key;
  /** The rate as sent (`'0.5'`, `'100/m'`). */
  readonly rate: string;
  readonly capacity: number;
  /** Takes n tokens now or none (`atmost`: as many whole tokens as are there, at least `chunk`, default 1). */
  consume(n?: Amount, options?: AtMostOptions): Promise<Result>;
  /** Whether a request would be served now; changes nothing. */
  peek(): Promise<Result>;
  /** RESERVE: take the tokens now (into debt) if due within `maxWaitMs`; wait `retryAfterMs`, then proceed. */
  reserve(n?: Amount, options?: ReserveOptions): Promise<Result>;
  /** Waits until the tokens are taken; throws RateLimited past `timeoutMs`. */
  acquire(n?: Amount, options?: AcquireOptions): Promise<Result>;
  /** Gives back n tokens; the whole tokens now, or null for a missing key. */
  refund(n: Amount): Promise<number | null>;
  /** The bucket as of now, or null for a missing key (a full bucket). */
  info(): Promise<BucketInfo | null>;
  /** TB.CONSUME ... LEASE [KEEP]: lends n tokens until released or `ttlMs` passes; retried until `timeoutMs`. */
  lease(n?: Amount, options?: LeaseOptions & { keep?: boolean }): Promise<Result>;
  /**
   * Runs `fn` holding a lease (`keep`: an estimate, else a slot). Returned:
   * released, or settled to `lease.used` (or a returned `{ used }`). Threw a
   * NotSentError (or what `returnOn` accepts): released. Threw anything
   * else: an estimate settled at n, a slot held until its TTL.
   */
  withLease<T>(
    n: Amount,
    options: WithLeaseOptions & { keep?: boolean },
    fn: (lease: Lease<Result>) => Promise<T> | T,
  ): Promise<T>;
  /** TB.RELEASE: the whole tokens that went back (after the cap at capacity), or null when the lease is not held. */
  release(leaseId: Amount): Promise<number | null>;
  /** TB.RELEASE ... USED: settles a lease once; negative when an overrun was charged; null if not held. */
  settle(leaseId: Amount, used: Amount): Promise<number | null>;
  /** Batches of this bucket's tokens handed out locally, for a hot key. */
  batched(batch: number, options?: BatchOptions): Batcher;
}

/** `[bucket, n]` taken; `[bucket, n, 'estimate' | 'slot']` lent. */
export type LeasePart = readonly [TokenBucket, Amount] | readonly [TokenBucket, Amount, 'estimate' | 'slot'];

export interface WithLeaseOptions extends LeaseOptions {
  /** Errors that mean the request never left (besides NotSentError): everything is given back. */
  returnOn?: (err: unknown) => boolean;
}

/** Thrown or wrapped (as `cause`) by a lease's body: the request never left, give everything back. */
export declare class NotSentError extends Error {
  constructor(message?: string, options?: { cause?: unknown });
  readonly name: 'NotSentError';
}

/**
 * Leases held. `done()`: slots released, estimates settled to `used`;
 * `failed()`: estimates settled at the estimate, slots held until their
 * TTL; `giveBack()`: everything back. Only the first call acts.
 */
export declare class Lease<R extends Result | MultiResult = Result | MultiResult> {
  constructor(parts: ReadonlyArray<{ bucket: TokenBucket; n: Amount; kind: 'taken' | 'estimate' | 'slot' }>, result: R);
  /** The grant. */
  readonly result: R;
  /** Each part's lease id (0 for a part taken). */
  readonly leaseIds: ReadonlyArray<number>;
  /** The first leased part's id. */
  readonly leaseId: number;
  /** Tokens used: estimates are settled to it on a normal exit. */
  used: Amount | undefined;
  /** Runs `fn(this)`, then done(), giveBack() (NotSentError, `returnOn`) or failed() by how it ended. */
  run<T>(fn: (lease: this) => Promise<T> | T, options?: { returnOn?: (err: unknown) => boolean }): Promise<T>;
  done(): Promise<void>;
  failed(): Promise<void>;
  giveBack(): Promise<void>;
}

export interface LeaseOptions extends FlowOptions {
  /** How long the lease lasts if never released, in ms (1 to 86400000). */
  ttlMs: number;
  /** How long to keep trying for it (default: until granted or never possible). */
  timeoutMs?: number;
  signal?: AbortSignal;
  /**
   * Wait on the server (TB.CONSUME or TB.MCONSUME ... LEASE ... BLOCK ms,
   * module only) on a dedicated connection: first come first served, one
   * call per grant. Polls on the Lua fallback.
   */
  block?: boolean;
}

export interface BatchOptions {
  /** Give back what is held after this long with no request (default 50). */
  holdMs?: number;
  /** Give back what is held at the latest this long after it was taken (default 500). */
  maxHoldMs?: number;
}

/**
 * Hot keys: tokens handed out locally from batches taken in one call
 * (`ATMOST batch MIN n`); the global bound stays exact, and what is held goes
 * back after `holdMs` idle, on close, and at the latest `maxHoldMs` after it
 * was taken.
 */
export declare class Batcher {
  constructor(bucket: TokenBucket, batch: number, options?: BatchOptions);
  readonly bucket: TokenBucket;
  /** Tokens taken from the server and not handed out yet. */
  readonly held: number;
  readonly handedOut: number;
  readonly batches: number;
  readonly givenBack: number;
  /** null when served from the batch; else the reply of the call that took a new one. */
  consume(n?: number): Promise<Result | null>;
  /** Takes n tokens, sleeping between calls; throws RateLimited past `timeoutMs`. */
  acquire(n?: number, options?: { timeoutMs?: number }): Promise<void>;
  /** Gives back what is held. */
  close(): Promise<void>;
}
