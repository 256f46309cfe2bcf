// BullMQ: a processor guarded by a fleet-wide tb bucket.
//
//   import { limitProcessor } from 'tb-limiter/bullmq';
//   new Worker('llm', limitProcessor((job) => limiter.bucket(`tenant:${job.data.tenant}`, '0.5', 1), callApi), { connection });
//
// Each job reserves its turn (TB.CONSUME ... RESERVE: first come, first
// served across every worker of every process). A job whose turn is later
// is moved to the delayed set until then (`job.moveToDelayed(due, token)`,
// `throw new DelayedError()`): it holds no worker meanwhile, other jobs (other
// tenants) go on, and the queue is never paused. It comes back `leadMs`
// early and waits the rest in the worker, because BullMQ promotes delayed
// jobs a few milliseconds late by varying amounts, which would bring two
// calls closer than the limit.
//
// The reservation travels with the job, in its data under
// `tbReservation` ({ due, started, key }), valid only for the job's next
// start (`job.attemptsStarted`): a retry after a failure, or a job restarted
// after it stalled while running, reserves again.

import { RateLimited, Result } from './index.js';

/** @import { Amount, Lease, LeasePart, Limiter, MultiResult, TokenBucket } from './index.js' */


// No `import 'bullmq'`: the package resolves its imports from its own real
// path, which is not the user's project when it is installed by path (npm
// links it), and a second copy of BullMQ would not be the user's anyway.
// The user's BullMQ recognises the errors a processor throws by their name
// (DelayedError, UnrecoverableError: `err.name == ...` beside `instanceof`
// in its Worker and Job) and the rate-limit error by its message, whichever
// copy of BullMQ made them: so these are made here.

/** Thrown after `job.moveToDelayed`: BullMQ leaves the job delayed. */
class DelayedError extends Error {
  /** @param {string} [message] */
  constructor(message = 'bullmq:movedToDelayed') {
    super(message);
    this.name = 'DelayedError';
  }
}

/** A job that can never succeed: BullMQ fails it without retrying. */
class UnrecoverableError extends Error {
  /** @param {string} message */
  constructor(message) {
    super(message);
    this.name = 'UnrecoverableError';
  }
}

/** BullMQ's `Worker.RateLimitError()`: after `queue.rateLimit(ms)`, the job goes back to the wait list. */
function rateLimitError() {
  const e = new Error('bullmq:rateLimitExceeded');
  e.name = 'RateLimitError';
  return e;
}

/** The field of the job's data that carries its reservation. */
export const RESERVATION_FIELD = /** @type {const} */ ('tbReservation');

/**
 * Waits `ms`; an aborted `signal` ends the wait with its reason.
 * @param {number} ms
 * @param {AbortSignal | undefined} signal
 * @returns {Promise<void>}
 */
const sleep = (ms, signal) =>
  /** @type {Promise<void>} */ (
  new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const timer = setTimeout(done, ms);
    function done() {
      signal?.removeEventListener('abort', abort);
      resolve();
    }
    function abort() {
      clearTimeout(timer);
      reject(signal?.reason);
    }
    signal?.addEventListener('abort', abort, { once: true });
  }));

/**
 * @param {unknown} x
 * @returns {x is Record<string, unknown>}
 */
function isPlainObject(x) {
  return x !== null && typeof x === 'object' && Object.getPrototypeOf(x) === Object.prototype;
}

/**
 * @param {string | Buffer} key
 * @returns {string}
 */
function keyText(key) {
  return Buffer.isBuffer(key) ? key.toString('latin1') : String(key);
}

/**
 * Wraps a BullMQ processor so that it runs only with a token of `bucket`
 * (a TokenBucket, or a function of the job giving one: per-tenant keys).
 *
 * Options:
 * - `cost`: tokens per job (a number, or a function of the job); default 1.
 * - `maxWaitMs`: the longest wait a reservation may hold (default: the
 *   server's `tb.max-wait-ms`). When more than that is queued on the
 *   bucket, the job takes nothing and is delayed until half this window has
 *   drained, then tries again.
 * - `leadMs`: how early a delayed job comes back to wait the rest in the
 *   worker (default 250).
 * - `queue`: a BullMQ Queue for the queue-wide case, where one bucket
 *   guards the whole queue: a job waits for its reserved turn in the worker
 *   (keep `maxWaitMs` to a few intervals: each waiting job holds a slot of
 *   the worker's concurrency), and when the bucket's backlog is longer than
 *   `maxWaitMs`, the queue is rate-limited (`queue.rateLimit`) and the job
 *   goes back to the head of the wait list, keeping its place, while no
 *   worker asks the bucket in vain. Never use it with per-tenant buckets:
 *   it stops the whole queue.
 *
 * Order: tokens go first come, first served in the order workers ask the
 * bucket (jobs fetched at the same moment by different workers may ask in
 * either order). Jobs denied because the backlog is longer than `maxWaitMs`
 * ask again when half the window has drained, in the order they come back.
 *
 * Fair share: `flow` (a string or Buffer, or a function of the job giving
 * one, e.g. `(job) => job.data.tenant`; null or undefined for no flow) and
 * `weight` (a number, or a function of the job; default 1). A job with a
 * flow waits in the worker, on the server, in its flow's queue of the
 * bucket (TB.CONSUME ... BLOCK ms FLOW name [WEIGHT w], on a connection
 * of its own, for at most `maxWaitMs`) and reserves nothing: while several
 * flows wait, grants go to them in proportion to their weights, so one
 * tenant's backlog cannot starve the others. A job whose wait runs out
 * takes nothing and goes to the delayed set for the bucket's wait, then
 * asks again. Each waiting job holds a slot of the worker's concurrency:
 * only jobs a worker has started wait in a flow's queue. Not with `queue`
 * (a rate-limited queue would keep every flow from the bucket). On the Lua
 * fallback the flow is ignored: the job reserves as without it.
 *
 * A job that can never get its tokens (cost above the bucket's capacity)
 * fails with UnrecoverableError.
 * @template {JobLike} [J=JobLike]
 * @template [R=unknown]
 * @param {TokenBucket | ((job: J) => TokenBucket | Promise<TokenBucket>)} bucket
 * @param {(job: J, token?: string, signal?: AbortSignal) => Promise<R>} processor
 * @param {LimitProcessorOptions<J>} [options]
 * @returns {Processor<J, R>}
 */
export function limitProcessor(bucket, processor, options = {}) {
  if (typeof processor !== 'function') throw new TypeError('processor must be a function');
  const { cost = 1, maxWaitMs, leadMs = 250, queue, flow, weight } = options;
  if (!(leadMs >= 0)) throw new RangeError(`leadMs must be >= 0, got ${leadMs}`);
  if (queue && flow !== undefined && flow !== null) {
    throw new RangeError('flow cannot be combined with queue: a rate-limited queue would keep every flow from the bucket');
  }

  /** @type {Processor<J, R>} */
  return async function tbLimitedProcessor(job, token, signal) {
    const b = typeof bucket === 'function' ? await bucket(job) : bucket;
    const n = typeof cost === 'function' ? await cost(job) : cost;
    const f = typeof flow === 'function' ? await flow(job) : flow;
    const key = keyText(b.key);
    const data = job.data;
    /** @type {Reservation | undefined} */
    let held;
    if (isPlainObject(data) && RESERVATION_FIELD in data) {
      held = /** @type {Reservation} */ (data[RESERVATION_FIELD]);
      // The processor sees the job's own data.
      const { [RESERVATION_FIELD]: _, ...own } = data;
      job.data = own;
    }

    if (held && held.started === job.attemptsStarted && held.key === key) {
      // Back from the delayed set with the turn this job reserved.
      await waitTurn(held.due - Date.now(), signal, () => b.refund(n));
      return processor(job, token, signal);
    }

    if (f !== undefined && f !== null && b.limiter.backend !== 'lua') {
      const w = typeof weight === 'function' ? await weight(job) : weight;
      try {
        await b.acquire(n, { flow: f, weight: w, timeoutMs: maxWaitMs, signal });
      } catch (e) {
        if (!(e instanceof RateLimited)) throw e;
        if (e.result.never) {
          throw new UnrecoverableError(`tb: ${n} tokens of ${JSON.stringify(key)} can never be had (capacity ${b.capacity})`);
        }
        await job.moveToDelayed(Date.now() + Math.max(1, e.result.retryAfterMs), token);
        throw new DelayedError();
      }
      return processor(job, token, signal);
    }

    const { reply, windowMs } = await b._reserve(n, maxWaitMs);
    const r = Result.fromReply(/** @type {unknown[]} */ (reply));
    if (r.allowed) {
      if (r.retryAfterMs === 0) return processor(job, token, signal);
      const due = Date.now() + r.retryAfterMs;
      if (queue || r.retryAfterMs <= leadMs || !isPlainObject(job.data)) {
        // Wait in the worker: the wait is short, or nothing can carry the
        // reservation, or (queue-wide) a rate-limited queue would hold the
        // job in the delayed set past its turn.
        await waitTurn(r.retryAfterMs, signal, () => b.refund(r.granted));
        return processor(job, token, signal);
      }
      try {
        await job.updateData({ ...job.data, [RESERVATION_FIELD]: { due, started: job.attemptsStarted + 1, key } });
      } catch (e) {
        // Nothing carries the reservation: give it back.
        await b.refund(r.granted).catch(() => {});
        throw e;
      }
      // From here the job holds its turn, wherever it runs next; if the move
      // fails (say the lock was lost), the turn stays with the job's data.
      await job.moveToDelayed(due - leadMs, token);
      throw new DelayedError();
    }
    if (r.never) {
      throw new UnrecoverableError(`tb: ${n} tokens of ${JSON.stringify(key)} can never be had (capacity ${b.capacity})`);
    }
    // More is queued on the bucket than the longest wait: come back when
    // half of the window has drained, holding nothing meanwhile.
    const back = Math.max(1, r.retryAfterMs - Math.floor(windowMs / 2));
    if (queue) {
      await queue.rateLimit(back);
      throw rateLimitError();
    }
    await job.moveToDelayed(Date.now() + back, token);
    throw new DelayedError();
  };
}

/**
 * A job's reservation, in its data while it is delayed: valid for the
 * job's next start only.
 * @typedef {{ due: number, started: number, key: string }} Reservation
 */

/**
 * Waits `ms` for a reserved turn; if the job is cancelled meanwhile, gives the turn back.
 * @param {number} ms
 * @param {AbortSignal | undefined} signal
 * @param {() => Promise<unknown>} giveBack
 * @returns {Promise<void>}
 */
async function waitTurn(ms, signal, giveBack) {
  if (ms <= 0) return;
  try {
    await sleep(ms, signal);
  } catch (e) {
    await giveBack().catch(() => {});
    throw e;
  }
}

/**
 * Wraps a BullMQ processor so that it runs holding several limits at once,
 * leased in one all-or-nothing TB.MCONSUME (RPM + TPM + in flight):
 * `parts` (an array, or a function of the job giving one) are
 * `[bucket, n]` taken, `[bucket, n, 'estimate']` lent with KEEP, and
 * `[bucket, n, 'slot']` lent, for `ttlMs` (longer than the call can take).
 * The processor gets the {@link Lease} as its fourth argument: set
 * `lease.used` to the tokens the call used.
 *
 * Never waits in the worker: when a part is short, the job takes nothing
 * and goes to the delayed set for the server's wait (at most `maxDelayMs`,
 * default 1000: a lease given back early frees the part sooner than the
 * wait the server names), then asks again. A job that can never be served
 * fails with UnrecoverableError.
 *
 * After the processor: returned, slots released and estimates settled to
 * `lease.used`; threw a NotSentError (or an error `returnOn` accepts),
 * everything given back; threw anything else (the call may have reached
 * the provider), estimates kept charged and slots held until their TTL,
 * and the error goes to BullMQ (which retries the job as configured). A
 * release that fails after the processor returned does not fail the job.
 *
 * Fair share: `flow` and `weight` (values, or functions of the job, as for
 * {@link limitProcessor}). A job with a flow waits in the worker, on the
 * server, in its flow's queue of the bucket that makes it wait (for at
 * most `maxWaitMs`, default the server's `tb.max-wait-ms`), then is delayed
 * as above if its wait ran out. Ignored on the Lua fallback.
 * @template {JobLike} [J=JobLike]
 * @template [R=unknown]
 * @param {ReadonlyArray<LeasePart> | ((job: J) => ReadonlyArray<LeasePart> | Promise<ReadonlyArray<LeasePart>>)} parts
 * @param {(job: J, token: string | undefined, signal: AbortSignal | undefined, lease: Lease<MultiResult>) => Promise<R>} processor
 * @param {LeaseProcessorOptions<J>} options
 * @returns {Processor<J, R>}
 */
export function leaseProcessor(parts, processor, options) {
  if (typeof processor !== 'function') throw new TypeError('processor must be a function');
  const { ttlMs, maxDelayMs = 1000, returnOn, limiter, flow, weight, maxWaitMs } = options ?? /** @type {LeaseProcessorOptions<J>} */ ({});
  if (!(maxDelayMs >= 1)) throw new RangeError(`maxDelayMs must be >= 1, got ${maxDelayMs}`);

  /** @type {Processor<J, R>} */
  return async function tbLeasedProcessor(job, token, signal) {
    const items = typeof parts === 'function' ? await parts(job) : parts;
    const owner = limiter ?? items[0][0].limiter;
    const f = typeof flow === 'function' ? await flow(job) : flow;
    const queued = f !== undefined && f !== null && owner.backend !== 'lua';
    const w = !queued ? undefined : typeof weight === 'function' ? await weight(job) : weight;
    /** @type {Lease<MultiResult>} */
    let lease;
    try {
      lease = await owner.leaseMany(
        items,
        queued
          ? { ttlMs, timeoutMs: maxWaitMs ?? owner.maxWaitMs, signal, flow: f, weight: w }
          : { ttlMs, timeoutMs: 0, signal },
      );
    } catch (e) {
      if (!(e instanceof RateLimited)) throw e;
      const r = e.result;
      if (r.never) {
        throw new UnrecoverableError(`tb: ${e.message}`);
      }
      await job.moveToDelayed(Date.now() + Math.min(Math.max(1, r.retryAfterMs), maxDelayMs), token);
      throw new DelayedError();
    }
    // The job's outcome is the processor's: a release that fails after it
    // returned leaves the slot held until its TTL (the safe side) rather
    // than failing a job whose call was made (a retry would make it again).
    let done = false;
    /** @type {R | undefined} */
    let out;
    try {
      return await lease.run(
        async (held) => {
          out = await processor(job, token, signal, held);
          done = true;
          return out;
        },
        { returnOn },
      );
    } catch (e) {
      if (done) return /** @type {R} */ (out);
      throw e;
    }
  };
}

// ---------------------------------------------------------------------------
// Types (JSDoc). At the end of the file: TypeScript 7's declaration emit
// gives a @typedef's comment to the statement after it, not to the type
// (microsoft/TypeScript#63958), so here it goes to no statement.
// ---------------------------------------------------------------------------

// The types are structural: BullMQ's Job and Queue fit them (its Job's
// methods take its own data type: method parameters are compared both
// ways, so a Job<T> fits JobLike).

/**
 * What the helper uses of a BullMQ Job. `data` is `any`, as in BullMQ's
 * own `Job` (its default data type): a processor wrapped inside `new
 * Worker(...)` gets no job type from the Worker (TypeScript infers none
 * there), and its untyped `job.data.tenant` must compile as it does
 * without the helper; annotate the job (`job: Job<{ tenant: string }>`)
 * for a checked one. The one `any` of the package's types
 * (test/declarations.test.js).
 * @typedef {{
 *   data: any,
 *   readonly attemptsStarted: number,
 *   updateData(data: unknown): Promise<void>,
 *   moveToDelayed(timestamp: number, token?: string): Promise<void>,
 * }} JobLike
 */

/**
 * What the helper uses of a BullMQ Queue (the queue-wide case).
 * @typedef {{ rateLimit(expireTimeMs: number): Promise<void> }} QueueLike
 */

/**
 * Fair share: the flow a job waits in (a string or Buffer of 1 to 128 bytes,
 * or a function of the job giving one, e.g. `(job) => job.data.tenant`; null
 * or undefined: no flow) and its weight (1 to 1000000, default 1). A job
 * with a flow waits in the worker, on the server, in its flow's queue, for
 * at most `maxWaitMs`; ignored on the Lua fallback.
 * @template {JobLike} [J=JobLike]
 * @typedef {Object} FlowOf
 * @property {string | Buffer | ((job: J) => FlowName | Promise<FlowName>)} [flow] The flow's name, or a function of the job giving it.
 * @property {number | ((job: J) => number | Promise<number>)} [weight] The flow's weight, or a function of the job giving it.
 */

/** A flow's name; null or undefined: no flow. @typedef {string | Buffer | null | undefined} FlowName */

/**
 * @template {JobLike} [J=JobLike]
 * @typedef {Object} LimitOptions
 * @property {Amount | ((job: J) => Amount | Promise<Amount>)} [cost] Tokens per job (or a function of the job); default 1.
 * @property {number} [maxWaitMs] The longest wait a reservation may hold (default: the server's `tb.max-wait-ms`).
 * @property {number} [leadMs] How early a delayed job comes back to wait the rest in the worker; default 250.
 * @property {QueueLike} [queue] Queue-wide case (one bucket for the whole queue): rate-limit this queue while the bucket's backlog is too long. Not with `flow`.
 */
/** @template {JobLike} [J=JobLike] @typedef {FlowOf<J> & LimitOptions<J>} LimitProcessorOptions */

/**
 * @template {JobLike} [J=JobLike]
 * @typedef {Object} LeaseOptionsOf
 * @property {number} ttlMs How long the leases last if the worker vanishes, in ms: longer than the call can take.
 * @property {number} [maxDelayMs] The longest a job short of a part waits in the delayed set before asking again; default 1000.
 * @property {(err: unknown) => boolean} [returnOn] Errors that mean the request never left (besides NotSentError): everything is given back.
 * @property {Limiter} [limiter] The limiter to call (default: the first part's bucket's).
 * @property {number} [maxWaitMs] With a flow: how long a job waits in its flow's queue before it is delayed (default: the server's `tb.max-wait-ms`).
 */
/** @template {JobLike} [J=JobLike] @typedef {FlowOf<J> & LeaseOptionsOf<J>} LeaseProcessorOptions */

/**
 * A BullMQ processor: what a Worker runs for each job.
 * @template {JobLike} J
 * @template R
 * @typedef {(job: J, token?: string, signal?: AbortSignal) => Promise<R>} Processor
 */
