import type { Amount, Lease, LeasePart, Limiter, MultiResult, TokenBucket } from './index.js';
/** The field of the job's data that carries its reservation. */
export declare const RESERVATION_FIELD: 'tbReservation';
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
export declare function limitProcessor<J extends JobLike = JobLike, R = unknown>(bucket: TokenBucket | ((job: J) => TokenBucket | Promise<TokenBucket>), processor: (job: J, token?: string, signal?: AbortSignal) => Promise<R>, options?: LimitProcessorOptions<J>): Processor<J, R>;
export type Reservation = {
    due: number;
    started: number;
    key: string;
};
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
export declare function leaseProcessor<J extends JobLike = JobLike, R = unknown>(parts: ReadonlyArray<LeasePart> | ((job: J) => ReadonlyArray<LeasePart> | Promise<ReadonlyArray<LeasePart>>), processor: (job: J, token: string | undefined, signal: AbortSignal | undefined, lease: Lease<MultiResult>) => Promise<R>, options: LeaseProcessorOptions<J>): Processor<J, R>;
export type JobLike = {
    data: any;
    readonly attemptsStarted: number;
    updateData(data: unknown): Promise<void>;
    moveToDelayed(timestamp: number, token?: string): Promise<void>;
};
export type QueueLike = {
    rateLimit(expireTimeMs: number): Promise<void>;
};
export type FlowOf<J extends JobLike = JobLike> = {
    /**
     * The flow's name, or a function of the job giving it.
     */
    flow?: string | Buffer | ((job: J) => FlowName | Promise<FlowName>);
    /**
     * The flow's weight, or a function of the job giving it.
     */
    weight?: number | ((job: J) => number | Promise<number>);
};
export type FlowName = string | Buffer | null | undefined;
export type LimitOptions<J extends JobLike = JobLike> = {
    /**
     * Tokens per job (or a function of the job); default 1.
     */
    cost?: Amount | ((job: J) => Amount | Promise<Amount>);
    /**
     * The longest wait a reservation may hold (default: the server's `tb.max-wait-ms`).
     */
    maxWaitMs?: number;
    /**
     * How early a delayed job comes back to wait the rest in the worker; default 250.
     */
    leadMs?: number;
    /**
     * Queue-wide case (one bucket for the whole queue): rate-limit this queue while the bucket's backlog is too long. Not with `flow`.
     */
    queue?: QueueLike;
};
export type LimitProcessorOptions<J extends JobLike = JobLike> = FlowOf<J> & LimitOptions<J>;
export type LeaseOptionsOf<J extends JobLike = JobLike> = {
    /**
     * How long the leases last if the worker vanishes, in ms: longer than the call can take.
     */
    ttlMs: number;
    /**
     * The longest a job short of a part waits in the delayed set before asking again; default 1000.
     */
    maxDelayMs?: number;
    /**
     * Errors that mean the request never left (besides NotSentError): everything is given back.
     */
    returnOn?: (err: unknown) => boolean;
    /**
     * The limiter to call (default: the first part's bucket's).
     */
    limiter?: Limiter;
    /**
     * With a flow: how long a job waits in its flow's queue before it is delayed (default: the server's `tb.max-wait-ms`).
     */
    maxWaitMs?: number;
};
export type LeaseProcessorOptions<J extends JobLike = JobLike> = FlowOf<J> & LeaseOptionsOf<J>;
export type Processor<J extends JobLike, R> = (job: J, token?: string, signal?: AbortSignal) => Promise<R>;
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
