// limitProcessor's edge cases, with a real BullMQ worker in this process:
// a retry after a failure reserves a new token (the turn in the job's data
// holds only for its next start), and a job that can never be served fails
// at once without running.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { Queue, QueueEvents, Worker } from 'bullmq';
import Redis from 'ioredis';
import { Limiter } from 'tb-limiter';
import { limitProcessor } from 'tb-limiter/bullmq';

import { info } from './helpers/fixtures.js';
import { Server } from './helpers/server.js';

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

/** Runs `jobs` through a worker with `processor` guarded by `bucket`; returns their final states. */
async function runJobs(name, bucket, processor, jobs, options = {}) {
  const queue = new Queue(name, { connection });
  const events = new QueueEvents(name, { connection });
  await events.waitUntilReady();
  const worker = new Worker(name, limitProcessor(bucket, processor, options), { connection, concurrency: 2 });
  try {
    const added = await queue.addBulk(jobs);
    const finished = [];
    for (const job of added) {
      finished.push(await job.waitUntilFinished(events).then(() => 'completed', (e) => `failed: ${e.message}`));
    }
    return { finished, jobs: await Promise.all(added.map((j) => queue.getJob(j.id))) };
  } finally {
    await worker.close();
    await events.close();
    await queue.close();
  }
}

test('a retry after a failure reserves again; the turn it had is spent', async () => {
  await admin.flushall();
  await admin.call('TB.CONFIG', 'RESETSTAT');
  const bucket = limiter.bucket('api:retry', 5, 1);
  const t0 = performance.now();
  await bucket.consume(); // empty: the first attempt reserves a turn 200 ms away, the retry the next one
  const calls = [];
  const { finished, jobs } = await runJobs(
    'retry',
    bucket,
    async (job) => {
      calls.push({ attempt: job.attemptsMade, started: job.attemptsStarted, at: performance.now() });
      if (job.attemptsMade === 0) throw new Error('the API failed');
      return 'ok';
    },
    [{ name: 'call', data: { n: 1 }, opts: { attempts: 2 } }],
    { leadMs: 50 },
  );
  assert.deepEqual(finished, ['completed']);
  assert.deepEqual(calls.map((c) => c.attempt), [0, 1]);
  // Two calls, two turns: the drain above, then one reservation per call.
  const stats = await info(admin, 'tb');
  assert.equal(Number(stats.tb_tokens_granted), 3, JSON.stringify(stats));
  assert.equal(Number(stats.tb_reservations), 2, 'each attempt reserved its own turn');
  // The second turn is 400 ms after the drain (a tick of the server's ms clock aside).
  assert.ok(calls[0].at - t0 >= 199 && calls[1].at - t0 >= 399, `calls at ${calls.map((c) => c.at - t0)} ms`);
  assert.equal(jobs[0].data.tbReservation?.started, jobs[0].attemptsStarted, 'the turn it used is in its data');
});

test('a job that can never be served fails at once, without running', async () => {
  await admin.flushall();
  let ran = 0;
  const { finished, jobs } = await runJobs(
    'never',
    limiter.bucket('api:never', 1, 1),
    async () => {
      ran += 1;
    },
    [{ name: 'call', data: {}, opts: { attempts: 5 } }],
    { cost: 2 },
  );
  assert.equal(ran, 0);
  assert.match(finished[0], /can never be had/);
  assert.equal(jobs[0].attemptsMade, 1, 'UnrecoverableError: no retries');
});
