// The replies of TB.CONSUME, TB.MCONSUME and TB.INFO as objects.

/**
 * A reply's integer (a number, or a string or Buffer of digits) as a number.
 * @param {unknown} x
 * @returns {number}
 */
export function int(x) {
  return typeof x === 'number' ? x : Number(Buffer.isBuffer(x) ? x.toString() : x);
}

/**
 * @param {unknown} x
 * @returns {string}
 */
function text(x) {
  return Buffer.isBuffer(x) ? x.toString() : String(x);
}

/**
 * Milliseconds to seconds; -1 (never) is Infinity.
 * @param {number} ms
 * @returns {number}
 */
function seconds(ms) {
  return ms < 0 ? Infinity : ms / 1000;
}

/**
 * The reply of TB.CONSUME: `[allowed, remaining, retry_after_ms,
 * reset_after_ms, granted]`. `retryAfterMs` is 0 when allowed now, the wait
 * (rounded up, never optimistic) when denied or reserved, -1 when the request
 * can never succeed; `resetAfterMs` is -1 for a bucket that never refills.
 * A denial carries `retryAfterMs > 0` too: check `allowed`, never the wait.
 */
export class Result {
  /** Whether the tokens were taken (or reserved). @readonly @type {boolean} */
  allowed;
  /** Whole tokens left, never negative. @readonly @type {number} */
  remaining;
  /** 0 when allowed now; the wait when denied or reserved; -1 when it can never succeed. @readonly @type {number} */
  retryAfterMs;
  /** Milliseconds until full; -1 if never (rate 0). @readonly @type {number} */
  resetAfterMs;
  /** Tokens taken: n when allowed (fewer with ATMOST), 0 when denied. @readonly @type {number} */
  granted;
  /** With LEASE: the lease id (0 when denied); else null. @readonly @type {number | null} */
  leaseId;

  /**
   * @param {boolean} allowed
   * @param {number} remaining
   * @param {number} retryAfterMs
   * @param {number} resetAfterMs
   * @param {number} granted
   * @param {number | null} [leaseId]
   */
  constructor(allowed, remaining, retryAfterMs, resetAfterMs, granted, leaseId = null) {
    this.allowed = allowed;
    this.remaining = remaining;
    this.retryAfterMs = retryAfterMs;
    this.resetAfterMs = resetAfterMs;
    this.granted = granted;
    this.leaseId = leaseId;
    Object.freeze(this);
  }

  /**
   * Builds a result from the reply's five integers (six with a lease id).
   * @param {ReadonlyArray<unknown>} reply
   * @returns {Result}
   */
  static fromReply(reply) {
    const [a, rem, retry, reset, granted, leaseId] = reply.map(int);
    return new Result(a === 1, rem, retry, reset, granted, reply.length > 5 ? leaseId : null);
  }

  /** True when the request can never succeed (n > capacity, or rate 0 and too few tokens). */
  get never() {
    return this.retryAfterMs < 0;
  }

  /** Seconds to wait before proceeding (or retrying); Infinity for never. */
  get retryAfter() {
    return seconds(this.retryAfterMs);
  }

  /**
   * The reply as the server sent it.
   * @returns {number[]}
   */
  get reply() {
    const head = [this.allowed ? 1 : 0, this.remaining, this.retryAfterMs, this.resetAfterMs, this.granted];
    return this.leaseId === null ? head : [...head, this.leaseId];
  }
}

/**
 * The reply of TB.MCONSUME: `[allowed, retry_after_ms, remaining_1, ...]`,
 * and with ATMOST one more, `granted`.
 */
export class MultiResult {
  /** Whether every part was taken (or reserved). @readonly @type {boolean} */
  allowed;
  /** 0 when allowed now; the wait when denied or reserved; -1 when some part can never succeed. @readonly @type {number} */
  retryAfterMs;
  /** Whole tokens left in each bucket, in order. @readonly @type {ReadonlyArray<number>} */
  remaining;
  /** With `atmost`: the grant of every part asking for the largest n (0 when denied); else null. @readonly @type {number | null} */
  granted;
  /** With LEASE parts: every part's lease id (0 for a part taken, and when denied); else null. @readonly @type {ReadonlyArray<number> | null} */
  leaseIds;

  /**
   * @param {boolean} allowed
   * @param {number} retryAfterMs
   * @param {number[]} remaining
   * @param {number | null} [granted]
   * @param {number[] | null} [leaseIds]
   */
  constructor(allowed, retryAfterMs, remaining, granted = null, leaseIds = null) {
    this.allowed = allowed;
    this.retryAfterMs = retryAfterMs;
    this.remaining = Object.freeze(remaining);
    this.granted = granted;
    this.leaseIds = leaseIds === null ? null : Object.freeze(leaseIds);
    Object.freeze(this);
  }

  /**
   * Builds a result from the reply (`leases`: it ends with a lease id per part).
   * @param {ReadonlyArray<unknown>} reply
   * @param {boolean} [atmost] the reply ends with `granted` (ATMOST)
   * @param {boolean} [leases] the reply ends with a lease id per part
   * @returns {MultiResult}
   */
  static fromReply(reply, atmost = false, leases = false) {
    const [a, retry, ...remaining] = reply.map(int);
    const granted = atmost ? (remaining.pop() ?? null) : null;
    const leaseIds = leases ? remaining.splice(remaining.length / 2) : null;
    return new MultiResult(a === 1, retry, remaining, granted, leaseIds);
  }

  /** True when some bucket can never give its n. */
  get never() {
    return this.retryAfterMs < 0;
  }

  /** `retryAfterMs` in seconds; Infinity for never. */
  get retryAfter() {
    return seconds(this.retryAfterMs);
  }

  /**
   * The reply as the server sent it.
   * @returns {number[]}
   */
  get reply() {
    const extra = this.granted === null ? [] : [this.granted];
    return [this.allowed ? 1 : 0, this.retryAfterMs, ...this.remaining, ...extra, ...(this.leaseIds ?? [])];
  }
}

/**
 * The reply of TB.INFO as numbers: the bucket as of now (read-only).
 * `tokens` and `rate` are also given as the server's exact decimals.
 */
export class BucketInfo {
  /** Tokens now (negative while reservations are pending). @readonly @type {number} */
  tokens;
  /** `tokens` as the server's exact decimal string (e.g. `"-1.992"`). @readonly @type {string} */
  tokensExact;
  /** Burst size: the most tokens the bucket holds. @readonly @type {number} */
  capacity;
  /** Tokens per second. @readonly @type {number} */
  rate;
  /** `rate` as the server's decimal string (`100/m` is `"1.666666666667"`). @readonly @type {string} */
  rateExact;
  /** Server time (ms since the epoch) of the stored state. @readonly @type {number} */
  updatedAtMs;
  /** Milliseconds until the bucket is full; -1 for never. @readonly @type {number} */
  resetAfterMs;
  /** Milliseconds until the key expires; -1 for no expiry. @readonly @type {number} */
  ttlMs;
  /** Calls queued on the bucket now (waiting for a grant, FLOW or not); 0 when none. @readonly @type {number} */
  waiting;
  /**
   * The flows with calls queued on the bucket, in the order they will be
   * served next: `{ name, weight, waiting }` (the name decoded as UTF-8;
   * the default flow of calls queued without FLOW has the name `''`);
   * empty when none wait.
   * @readonly @type {ReadonlyArray<FlowInfo>}
   */
  flows;

  /**
   * @internal
   * @param {Record<string, string | unknown[]>} fields TB.INFO's fields by name
   */
  constructor(fields) {
    this.tokens = Number(fields.tokens);
    this.tokensExact = String(fields.tokens);
    this.capacity = int(fields.capacity);
    this.rate = Number(fields.rate);
    this.rateExact = String(fields.rate);
    this.updatedAtMs = int(fields.updated_at_ms);
    this.resetAfterMs = int(fields.reset_after_ms);
    this.ttlMs = int(fields.ttl_ms);
    this.waiting = fields.waiting === undefined ? 0 : int(fields.waiting);
    const flows = fields.waiting_flows;
    this.flows = Object.freeze(flowsOf(Array.isArray(flows) ? flows : []));
    Object.freeze(this);
  }

  /**
   * Builds the info from TB.INFO's flat field/value array.
   * @param {ReadonlyArray<unknown>} reply
   * @returns {BucketInfo}
   */
  static fromReply(reply) {
    /** @type {Record<string, string | unknown[]>} */
    const fields = {};
    for (let i = 0; i + 1 < reply.length; i += 2) {
      const v = reply[i + 1];
      fields[text(reply[i])] = Array.isArray(v) ? v : text(v);
    }
    return new BucketInfo(fields);
  }
}

/**
 * `waiting_flows`, a flat `[name, weight, waiting, ...]`, as frozen `{ name, weight, waiting }`.
 * @param {ReadonlyArray<unknown>} flat
 * @returns {FlowInfo[]}
 */
function flowsOf(flat) {
  const out = [];
  for (let i = 0; i + 2 < flat.length; i += 3) {
    out.push(Object.freeze({ name: text(flat[i]), weight: int(flat[i + 1]), waiting: int(flat[i + 2]) }));
  }
  return out;
}

// ---------------------------------------------------------------------------
// Types (JSDoc). At the end of the file: TypeScript 7's declaration emit
// gives a @typedef's comment to the statement after it, not to the type
// (microsoft/TypeScript#63958), so here it goes to no statement.
// ---------------------------------------------------------------------------

/**
 * A flow with calls waiting on a bucket (`BucketInfo.flows`): its `name`,
 * decoded as UTF-8 (`''`: the default flow of calls queued without FLOW),
 * its `weight`, and the calls of this flow `waiting` on the bucket.
 * @typedef {{ readonly name: string, readonly weight: number, readonly waiting: number }} FlowInfo
 */
