// Compiled by `tsc --noEmit` in the tests: the shipped .d.ts files describe
// the API as a TypeScript user calls it, with each supported library.

import { Queue, Worker, type Job } from 'bullmq';
import { Cluster, Redis } from 'ioredis';
import { createClient, createCluster } from 'redis';
import {
  BucketInfo,
  Lease,
  NotSentError,
  CommandError,
  DEFAULT_MAX_WAIT_MS,
  Limiter,
  MultiResult,
  RateLimited,
  Result,
  SCRIPT,
  SCRIPT_SHA1,
  TokenBucket,
  type Backend,
  type FlowInfo,
} from 'tb-limiter';
import { RESERVATION_FIELD, leaseProcessor, limitProcessor } from 'tb-limiter/bullmq';

export async function usage(): Promise<void> {
  const nodeRedis = createClient({ url: 'redis://127.0.0.1:6379' });
  await nodeRedis.connect();
  const limiter = new Limiter(nodeRedis, { backend: 'auto', maxWaitMs: 10_000 });
  new Limiter(new Redis());
  new Limiter(new Cluster([{ host: '127.0.0.1', port: 7000 }]));
  new Limiter(createCluster({ rootNodes: [{ url: 'redis://127.0.0.1:7000' }] }));

  const backend: Backend | null = limiter.backend;
  const wait: number = limiter.maxWaitMs + DEFAULT_MAX_WAIT_MS;
  const llm: TokenBucket = limiter.bucket('llm:openai', '0.5', 1);
  limiter.bucket(Buffer.from('k'), 10, 5n);

  const r: Result = await llm.consume();
  const fields: [boolean, number, number, number, number, boolean, number] = [
    r.allowed, r.remaining, r.retryAfterMs, r.resetAfterMs, r.granted, r.never, r.retryAfter,
  ];
  await llm.consume(64_000, { atmost: true });
  await llm.peek();
  await llm.reserve(1, { maxWaitMs: 30_000 });
  await llm.acquire(1, { timeoutMs: 30_000, signal: AbortSignal.timeout(5_000), block: true });
  await llm.acquire(1, { timeoutMs: 30_000, flow: 'acme', weight: 3 });
  await llm.acquire(1, { flow: Buffer.from('acme') });
  const left: number | null = await llm.refund(800);
  const info: BucketInfo | null = await llm.info();
  if (info) {
    const n: number = info.tokens + info.capacity + info.rate + info.updatedAtMs + info.resetAfterMs + info.ttlMs;
    const s: string = info.tokensExact + info.rateExact;
    const waiting: number = info.waiting;
    const flows: ReadonlyArray<FlowInfo> = info.flows;
    const first: [string, number, number] | null = flows[0] ? [flows[0].name, flows[0].weight, flows[0].waiting] : null;
    void [n, s, waiting, first];
  }
  const rpm = limiter.bucket('{acme}:rpm', '500/m', 500);
  const tpm = limiter.bucket('{acme}:tpm', '30000/m', 30_000);
  const m: MultiResult = await limiter.consumeMany([[rpm, 1], [tpm, 2000]], { maxWaitMs: 20_000 });
  const rem: ReadonlyArray<number> = m.remaining;
  await limiter.acquireMany([[rpm, 1], [tpm, 2000]], { timeoutMs: 20_000 });
  await limiter.acquireMany([[rpm, 1], [tpm, 2000]], { timeoutMs: 20_000, flow: 'acme', weight: 2 });
  await limiter.execute('TB.INFO', ['k'], []);
  try {
    await llm.acquire();
  } catch (e) {
    if (e instanceof RateLimited) {
      const ms: number = e.retryAfterMs;
      const res: Result | MultiResult = e.result;
      void [ms, res];
    } else if (e instanceof CommandError) {
      const c: string = e.command;
      void c;
    }
  }
  await limiter.close();
  void [backend, wait, fields, left, rem, SCRIPT.length, SCRIPT_SHA1.length];

  // BullMQ: the guarded processor is a processor.
  const connection = new Redis({ maxRetriesPerRequest: null });
  const queue = new Queue('llm', { connection });
  const worker = new Worker(
    'llm',
    limitProcessor(
      (job: Job<{ tenant: string }>) => limiter.bucket(`tenant:${job.data.tenant}`, '0.5', 1),
      async (job: Job<{ tenant: string }>) => job.data.tenant,
      { cost: 1, maxWaitMs: 10_000, leadMs: 250 },
    ),
    { connection },
  );
  new Worker('all', limitProcessor(llm, async () => 1, { queue }), { connection });
  new Worker(
    'shared',
    limitProcessor(llm, async (job: Job<{ tenant: string; paid: boolean }>) => job.data.tenant, {
      flow: (job) => job.data.tenant,
      weight: (job) => (job.data.paid ? 3 : 1),
      maxWaitMs: 5_000,
    }),
    { connection },
  );
  void [worker, RESERVATION_FIELD];
  // Untyped inside a Worker, a job's data is BullMQ's default (any), as the README's snippets use it.
  new Worker('untyped', limitProcessor(llm, async (job) => `${job.data.tenant}`, { flow: (job) => job.data.tenant }), { connection });
  limitProcessor(llm, async (job: Job<{ tenant: string }>) => job.data.tenant, {
    // @ts-expect-error a typed job's data is checked
    flow: (job) => job.data.other,
  });

  // Leases: the failure rules, several limits at once, and BullMQ.
  const slots = limiter.bucket('{acme}:inflight', 0, 8);
  const parts = [[rpm, 1], [tpm, 2000, 'estimate'], [slots, 1, 'slot']] as const;
  const text: string = await limiter.withLeases(parts, { ttlMs: 60_000, returnOn: (e) => e instanceof TypeError }, async (lease) => {
    const ids: ReadonlyArray<number> = lease.leaseIds;
    if (ids.length === 0) throw new NotSentError('no request', { cause: new Error('refused') });
    lease.used = 1500;
    return 'reply';
  });
  const held: Lease<MultiResult> = await limiter.leaseMany(parts, { ttlMs: 60_000 });
  await limiter.leaseMany(parts, { ttlMs: 60_000, flow: 'acme', weight: 2 });
  await slots.lease(1, { ttlMs: 60_000, flow: 'acme' });
  await held.giveBack();
  await slots.withLease(1, { ttlMs: 60_000 }, async (lease: Lease<Result>) => lease.leaseId);
  await tpm.withLease(2000, { ttlMs: 60_000, keep: true }, async (lease) => {
    lease.used = 1200;
  });
  new Worker(
    'llm',
    leaseProcessor(
      (job: Job<{ estimate: number }>) => [[rpm, 1], [tpm, job.data.estimate, 'estimate'], [slots, 1, 'slot']],
      async (job: Job<{ estimate: number }>, _token, _signal, lease) => {
        lease.used = job.data.estimate;
        return 'done';
      },
      { ttlMs: 60_000, maxDelayMs: 1000, flow: (job) => `t${job.data.estimate}`, weight: 2, maxWaitMs: 2000 },
    ),
    { connection },
  );
  void text;

  // The client keeps its own type: the caller closes it with its own API.
  await limiter.client.quit();
  const io = new Limiter(new Redis());
  io.client.disconnect();
  const same: Redis = io.client;
  void same;
}

// Misuse fails to compile.
// @ts-expect-error a capacity is a number or a bigint
limiterFor().bucket('k', 1, '5');
// @ts-expect-error options, not a bare timeout
void limiterFor().bucket('k', 1, 5).acquire(1, 5000);
// @ts-expect-error no such backend
new Limiter(new Redis(), { backend: 'python' });
// @ts-expect-error a flow is a name, not a number
void limiterFor().bucket('k', 1, 5).acquire(1, { flow: 7 });
// @ts-expect-error a lease needs its ttlMs
void limiterFor().leaseMany([[bucketFor(), 1, 'slot']], {});
// @ts-expect-error a leased part is an 'estimate' or a 'slot'
void limiterFor().leaseMany([[bucketFor(), 1, 'borrowed']], { ttlMs: 1000 });
// @ts-expect-error leaseMany's options are not optional (ttlMs)
void limiterFor().leaseMany([[bucketFor(), 1, 'slot']]);
// @ts-expect-error an amount is a number or a bigint
void limiterFor().consumeMany([[bucketFor(), '1']]);
// @ts-expect-error acquireMany waits on a timer or in a flow's queue, never with block
void limiterFor().acquireMany([[bucketFor(), 1]], { block: true });
// @ts-expect-error execute's arguments are strings or numbers
void limiterFor().execute('TB.INFO', ['k'], [{}]);
// @ts-expect-error withLease's fn gets a Lease of one Result
void bucketFor().withLease(1, { ttlMs: 1000 }, (lease: Lease<MultiResult>) => lease.leaseIds);
// @ts-expect-error a BullMQ cost is an amount (or a function giving one)
limitProcessor(bucketFor(), async () => 1, { cost: '1' });
// @ts-expect-error leaseProcessor needs the leases' ttlMs
leaseProcessor([[bucketFor(), 1, 'slot']], async () => 1, {});

export async function readonlyResults(r: Result, m: MultiResult, info: BucketInfo, lease: Lease<Result>): Promise<void> {
  // @ts-expect-error a reply is read-only
  r.allowed = false;
  // @ts-expect-error so is a multi reply's list of remaining tokens
  m.remaining.push(1);
  // @ts-expect-error and the flows of TB.INFO
  info.flows[0].name = 'other';
  // @ts-expect-error a lease's grant cannot be swapped
  lease.result = r;
  lease.used = 3n; // the tokens used: the caller sets them
  const bucket = bucketFor();
  // @ts-expect-error a bucket's key is fixed
  bucket.key = 'other';
  // @ts-expect-error what a batcher holds is counted by it
  bucket.batched(2).held = 5;
  // The package's internals stay out of its types.
  // @ts-expect-error _reserve is internal
  void bucket._reserve;
  // @ts-expect-error so is the limiter's connection
  void limiterFor()._conn;
  // A raw reply is unknown, not any.
  const raw = await limiterFor().execute('TB.INFO', ['k'], []);
  // @ts-expect-error unknown until checked
  void raw.length;
  try {
    await bucket.acquire();
  } catch (e) {
    // @ts-expect-error the name of a RateLimited is 'RateLimited'
    if (e instanceof RateLimited && e.name === 'CommandError') throw e;
  }
}

function bucketFor(): TokenBucket {
  return limiterFor().bucket('k', 1, 5);
}

function limiterFor(): Limiter {
  return new Limiter(new Redis());
}
