// leaseProcessor with real BullMQ workers (issue 18 item 7): RPM taken, a
// TPM estimate and an in-flight slot leased in one TB.MCONSUME per job; a
// job short of a part goes to the delayed set for the server's wait (it
// never waits in the worker); after the call the leases end by how it
// ended (settled to the use reported; kept when it failed; given back when
// it was never sent).

import assert from 'node:assert/strict';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { after, before, test } from 'node:test';

import { Queue, QueueEvents, Worker } from 'bullmq';
import Redis from 'ioredis';
import { Limiter, NotSentError } from 'tb-limiter';
import { leaseProcessor } from 'tb-limiter/bullmq';

import { Server } from './helpers/server.js';

const FROZEN = '1e-9';

let server;
let admin;
let connection;
let limiter;
before(async () => {
  server = await Server.start({ module: true });
  admin = new Redis(server.port, '127.0.0.1');
  connection = new Redis(server.port, '127.0.0.1', { maxRetriesPerRequest: null });
  limiter = new Limiter(new Redis(server.port, '127.0.0.1'));
});
after(async () => {
  await limiter?.close();
  limiter?.client.disconnect();
  connection?.disconnect();
  admin?.disconnect();
  await server?.stop();
});

/** Two workers running `processor` (timed per call) on a fresh queue; returns the jobs' ends and the wrapper's timings. */
async function runJobs(name, wrapped, jobs, concurrency) {
  const queue = new Queue(name, { connection });
  const events = new QueueEvents(name, { connection });
  await events.waitUntilReady();
  const denied = [];
  const timed = async (job, token, signal) => {
    const t = performance.now();
    try {
      return await wrapped(job, token, signal);
    } catch (e) {
      if (e.name === 'DelayedError') denied.push(performance.now() - t);
      throw e;
    }
  };
  const workers = [0, 1].map(() => new Worker(name, timed, { connection, concurrency }));
  try {
    const added = await queue.addBulk(jobs);
    const finished = [];
    for (const job of added) {
      finished.push(await job.waitUntilFinished(events).then((v) => v, (e) => `failed: ${e.message}`));
    }
    return { finished, denied, jobs: await Promise.all(added.map((j) => queue.getJob(j.id))) };
  } finally {
    await Promise.all(workers.map((w) => w.close()));
    await events.close();
    await queue.close();
  }
}

test('RPM + TPM + in flight: never more than the slots at once, denied jobs delayed, not waited', async () => {
  await admin.flushall();
  const rpm = limiter.bucket('{llm}:rpm', '600/m', 5);
  const tpm = limiter.bucket('{llm}:tpm', '60000/m', 1200); // three estimates, 1000/s
  const slots = limiter.bucket('{llm}:inflight', 0, 3);
  let running = 0;
  let most = 0;
  const runs = new Map();
  const t0 = performance.now();
  const { finished, denied } = await runJobs(
    'leased',
    leaseProcessor(
      [[rpm, 1], [tpm, 400, 'estimate'], [slots, 1, 'slot']],
      async (job, _token, _signal, lease) => {
        running += 1;
        most = Math.max(most, running);
        runs.set(job.id, (runs.get(job.id) ?? 0) + 1);
        await sleep(200); // the API call
        running -= 1;
        lease.used = 300;
        return `done ${job.data.i}`;
      },
      { ttlMs: 5000, maxDelayMs: 200 },
    ),
    Array.from({ length: 10 }, (_, i) => ({ name: 'call', data: { i } })),
    6,
  );
  const elapsed = performance.now() - t0;
  console.log(
    `10 jobs, 2 workers x 6: ${most} at once (limit 3), ${denied.length} delays ` +
      `(longest ${Math.max(0, ...denied).toFixed(1)} ms in the worker), ${elapsed.toFixed(0)} ms`,
  );
  assert.deepEqual(finished, Array.from({ length: 10 }, (_, i) => `done ${i}`));
  assert.ok([...runs.values()].every((n) => n === 1), 'each job ran once');
  assert.ok(most <= 3, `${most} calls at once`);
  assert.ok(denied.length > 0, 'some jobs found a part short (the limits bound)');
  // A denied job costs one TB.MCONSUME and one moveToDelayed, never a wait
  // (one in the worker would last the server's wait, up to maxDelayMs).
  assert.ok(Math.max(...denied) < 200, `a denied job stayed ${Math.max(...denied)} ms in the worker`);
  assert.equal((await slots.info())?.tokens ?? 3, 3, 'every slot released');
});

test('a job that throws keeps its estimate charged and its slot held; a NotSentError gives back', async () => {
  await admin.flushall();
  const tpm = limiter.bucket('{f}:tpm', FROZEN, 2000);
  const slots = limiter.bucket('{f}:inflight', 0, 2);
  const parts = [[tpm, 400, 'estimate'], [slots, 1, 'slot']];
  const wrapped = leaseProcessor(
    parts,
    async (job, _t, _s, lease) => {
      if (job.data.kind === 'timeout') throw new Error('timed out: the provider may still be working');
      if (job.data.kind === 'refused') throw new NotSentError('connection refused');
      lease.used = 100;
      return 'ok';
    },
    { ttlMs: 60_000 },
  );
  const { finished } = await runJobs(
    'failing',
    wrapped,
    ['timeout', 'refused', 'ok'].map((kind) => ({ name: 'call', data: { kind } })),
    1,
  );
  assert.deepEqual(finished, ['failed: timed out: the provider may still be working', 'failed: connection refused', 'ok']);
  const [t, s] = await Promise.all([tpm.info(), slots.info()]);
  assert.equal(Math.round(t.tokens), 2000 - 400 - 100, 'the failed call kept 400, the ok one settled to 100');
  assert.equal(Math.round(s.tokens), 1, 'the failed call holds its slot until the TTL');
});
