/**
 * A reply's integer (a number, or a string or Buffer of digits) as a number.
 * @param {unknown} x
 * @returns {number}
 */
export declare function int(x: unknown): number;
/**
 * The reply of TB.CONSUME: `[allowed, remaining, retry_after_ms,
 * reset_after_ms, granted]`. `retryAfterMs` is 0 when allowed now, the wait
 * (rounded up, never optimistic) when denied or reserved, -1 when the request
 * can never succeed; `resetAfterMs` is -1 for a bucket that never refills.
 * A denial carries `retryAfterMs > 0` too: check `allowed`, never the wait.
 */
export declare class Result {
    /** Whether the tokens were taken (or reserved). @readonly @type {boolean} */
    readonly allowed: boolean;
    /** Whole tokens left, never negative. @readonly @type {number} */
    readonly remaining: number;
    /** 0 when allowed now; the wait when denied or reserved; -1 when it can never succeed. @readonly @type {number} */
    readonly retryAfterMs: number;
    /** Milliseconds until full; -1 if never (rate 0). @readonly @type {number} */
    readonly resetAfterMs: number;
    /** Tokens taken: n when allowed (fewer with ATMOST), 0 when denied. @readonly @type {number} */
    readonly granted: number;
    /** With LEASE: the lease id (0 when denied); else null. @readonly @type {number | null} */
    readonly leaseId: number | null;
    /**
     * @param {boolean} allowed
     * @param {number} remaining
     * @param {number} retryAfterMs
     * @param {number} resetAfterMs
     * @param {number} granted
     * @param {number | null} [leaseId]
     */
    constructor(allowed: boolean, remaining: number, retryAfterMs: number, resetAfterMs: number, granted: number, leaseId?: number | null);
    /**
     * Builds a result from the reply's five integers (six with a lease id).
     * @param {ReadonlyArray<unknown>} reply
     * @returns {Result}
     */
    static fromReply(reply: ReadonlyArray<unknown>): Result;
    /** True when the request can never succeed (n > capacity, or rate 0 and too few tokens). */
    get never(): boolean;
    /** Seconds to wait before proceeding (or retrying); Infinity for never. */
    get retryAfter(): number;
    /**
     * The reply as the server sent it.
     * @returns {number[]}
     */
    get reply(): number[];
}
/**
 * The reply of TB.MCONSUME: `[allowed, retry_after_ms, remaining_1, ...]`,
 * and with ATMOST one more, `granted`.
 */
export declare class MultiResult {
    /** Whether every part was taken (or reserved). @readonly @type {boolean} */
    readonly allowed: boolean;
    /** 0 when allowed now; the wait when denied or reserved; -1 when some part can never succeed. @readonly @type {number} */
    readonly retryAfterMs: number;
    /** Whole tokens left in each bucket, in order. @readonly @type {ReadonlyArray<number>} */
    readonly remaining: ReadonlyArray<number>;
    /** With `atmost`: the grant of every part asking for the largest n (0 when denied); else null. @readonly @type {number | null} */
    readonly granted: number | null;
    /** With LEASE parts: every part's lease id (0 for a part taken, and when denied); else null. @readonly @type {ReadonlyArray<number> | null} */
    readonly leaseIds: ReadonlyArray<number> | null;
    /**
     * @param {boolean} allowed
     * @param {number} retryAfterMs
     * @param {number[]} remaining
     * @param {number | null} [granted]
     * @param {number[] | null} [leaseIds]
     */
    constructor(allowed: boolean, retryAfterMs: number, remaining: number[], granted?: number | null, leaseIds?: number[] | null);
    /**
     * Builds a result from the reply (`leases`: it ends with a lease id per part).
     * @param {ReadonlyArray<unknown>} reply
     * @param {boolean} [atmost] the reply ends with `granted` (ATMOST)
     * @param {boolean} [leases] the reply ends with a lease id per part
     * @returns {MultiResult}
     */
    static fromReply(reply: ReadonlyArray<unknown>, atmost?: boolean, leases?: boolean): MultiResult;
    /** True when some bucket can never give its n. */
    get never(): boolean;
    /** `retryAfterMs` in seconds; Infinity for never. */
    get retryAfter(): number;
    /**
     * The reply as the server sent it.
     * @returns {number[]}
     */
    get reply(): number[];
}
/**
 * The reply of TB.INFO as numbers: the bucket as of now (read-only).
 * `tokens` and `rate` are also given as the server's exact decimals.
 */
export declare class BucketInfo {
    /** Tokens now (negative while reservations are pending). @readonly @type {number} */
    readonly tokens: number;
    /** `tokens` as the server's exact decimal string (e.g. `"-1.992"`). @readonly @type {string} */
    readonly tokensExact: string;
    /** Burst size: the most tokens the bucket holds. @readonly @type {number} */
    readonly capacity: number;
    /** Tokens per second. @readonly @type {number} */
    readonly rate: number;
    /** `rate` as the server's decimal string (`100/m` is `"1.666666666667"`). @readonly @type {string} */
    readonly rateExact: string;
    /** Server time (ms since the epoch) of the stored state. @readonly @type {number} */
    readonly updatedAtMs: number;
    /** Milliseconds until the bucket is full; -1 for never. @readonly @type {number} */
    readonly resetAfterMs: number;
    /** Milliseconds until the key expires; -1 for no expiry. @readonly @type {number} */
    readonly ttlMs: number;
    /** Calls queued on the bucket now (waiting for a grant, FLOW or not); 0 when none. @readonly @type {number} */
    readonly waiting: number;
    /**
     * The flows with calls queued on the bucket, in the order they will be
     * served next: `{ name, weight, waiting }` (the name decoded as UTF-8;
     * the default flow of calls queued without FLOW has the name `''`);
     * empty when none wait.
     * @readonly @type {ReadonlyArray<FlowInfo>}
     */
    readonly flows: ReadonlyArray<FlowInfo>;
    /**
     * Builds the info from TB.INFO's flat field/value array.
     * @param {ReadonlyArray<unknown>} reply
     * @returns {BucketInfo}
     */
    static fromReply(reply: ReadonlyArray<unknown>): BucketInfo;
}
export type FlowInfo = {
    readonly name: string;
    readonly weight: number;
    readonly waiting: number;
};
/**
 * A flow with calls waiting on a bucket (`BucketInfo.flows`): its `name`,
 * decoded as UTF-8 (`''`: the default flow of calls queued without FLOW),
 * its `weight`, and the calls of this flow `waiting` on the bucket.
 * @typedef {{ readonly name: string, readonly weight: number, readonly waiting: number }} FlowInfo
 */
