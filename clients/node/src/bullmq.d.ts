// Types of tb-limiter/bullmq (hand-written; the package ships plain JavaScript).
// Structural: BullMQ's Job and Queue fit them, and nothing here imports
// 'bullmq' (the package may be installed by path, where the user's BullMQ
// is not reachable from the package's real path).

/** What the helper uses of a BullMQ Job. */
export interface JobLike {
  data: any;
  readonly attemptsStarted: number;
  updateData(data: any): Promise<void>;
  moveToDelayed(timestamp: number, token?: string): Promise<void>;
}

/** What the helper uses of a BullMQ Queue (the queue-wide case). */
export interface QueueLike {
  rateLimit(expireTimeMs: number): Promise<void>;
}

import type { Amount, Lease, LeasePart, Limiter, MultiResult, TokenBucket } from './index.js';

/** The field of a job's data that carries its reservation while it is delayed. */
export declare const RESERVATION_FIELD: 'tbReservation';

/**
 * Fair share: the flow a job waits in (a string or Buffer of 1 to 128 bytes,
 * or a function of the job giving one, e.g. `(job) => job.data.tenant`; null
 * or undefined: no flow) and its weight (1 to 1000000, default 1). A job
 * with a flow waits in the worker, on the server, in its flow's queue, for
 * at most `maxWaitMs`; ignored on the Lua fallback.
 */
export interface FlowOf<J extends JobLike = JobLike> {
  flow?: string | Buffer | ((job: J) => string | Buffer | null | undefined | Promise<string | Buffer | null | undefined>);
  weight?: number | ((job: J) => number | Promise<number>);
}

export interface LimitProcessorOptions<J extends JobLike = JobLike> extends FlowOf<J> {
  /** Tokens per job (or a function of the job); default 1. */
  cost?: Amount | ((job: J) => Amount | Promise<Amount>);
  /** The longest wait a reservation may hold (default: the server's `tb.max-wait-ms`). */
  maxWaitMs?: number;
  /** How early a delayed job comes back to wait the rest in the worker; default 250. */
  leadMs?: number;
  /** Queue-wide case (one bucket for the whole queue): rate-limit this queue while the bucket's backlog is too long. Not with `flow`. */
  queue?: QueueLike;
}

/**
 * Wraps a BullMQ processor so that it runs only with a token of `bucket`
 * (or of the bucket a function picks for the job: per-tenant keys).
 */
export declare function limitProcessor<J extends JobLike = JobLike, R = unknown>(
  bucket: TokenBucket | ((job: J) => TokenBucket | Promise<TokenBucket>),
  processor: (job: J, token?: string, signal?: AbortSignal) => Promise<R>,
  options?: LimitProcessorOptions<J>,
): (job: J, token?: string, signal?: AbortSignal) => Promise<R>;

export interface LeaseProcessorOptions<J extends JobLike = JobLike> extends FlowOf<J> {
  /** How long the leases last if the worker vanishes, in ms: longer than the call can take. */
  ttlMs: number;
  /** The longest a job short of a part waits in the delayed set before asking again; default 1000. */
  maxDelayMs?: number;
  /** Errors that mean the request never left (besides NotSentError): everything is given back. */
  returnOn?: (err: unknown) => boolean;
  /** The limiter to call (default: the first part's bucket's). */
  limiter?: Limiter<any>;
  /** With a flow: how long a job waits in its flow's queue before it is delayed (default: the server's `tb.max-wait-ms`). */
  maxWaitMs?: number;
}

/**
 * Wraps a BullMQ processor so that it runs holding several limits leased in
 * one TB.MCONSUME (RPM + TPM + in flight); a job short of a part goes to the
 * delayed set for the server's wait, never waiting in the worker.
 */
export declare function leaseProcessor<J extends JobLike = JobLike, R = unknown>(
  parts: ReadonlyArray<LeasePart> | ((job: J) => ReadonlyArray<LeasePart> | Promise<ReadonlyArray<LeasePart>>),
  processor: (job: J, token: string | undefined, signal: AbortSignal | undefined, lease: Lease<MultiResult>) => Promise<R>,
  options: LeaseProcessorOptions<J>,
): (job: J, token?: string, signal?: AbortSignal) => Promise<R>;
