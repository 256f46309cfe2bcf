// Fair share under saturation (issue 22) against real servers: calls with
// a flow wait in the server's queue of a saturated bucket, and while
// several flows wait, grants go to them in proportion to their weights,
// whatever the number of calls each has waiting; TB.INFO shows the flows
// while they wait; the Lua fallback takes the flow and ignores it (it
// polls); a BullMQ processor takes its flow from the job.
//
// The bounds come from the server's scheduler (src/fair.rs: start-time fair
// queueing counted in tokens): while two flows of weights w_a and w_b both
// wait, the tokens served to them over any run of grants differ from the
// weights' ratio by at most 1/w_a + 1/w_b tokens of virtual time (at most
// 2 tokens of either flow for equal weights, at cost 1). The client counts
// N grants in the order their replies arrive, on N different connections:
// the grants at the two ends of the window may have been decided just
// outside it, a few more. The tests allow 10% of N (10 grants in 100),
// several times what the mechanism and the window's edges can account for,
// and far from what first come first served would give (the flow with 20
// callers waiting would get 20 grants in 23).

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { Queue, QueueEvents, Worker } from 'bullmq';
import Redis from 'ioredis';
import { Limiter } from 'tb-limiter';
import { leaseProcessor, limitProcessor } from 'tb-limiter/bullmq';

import { LIBRARIES } from './helpers/clients.js';
import { Server } from './helpers/server.js';

const RATE = 50; // grants per second on the saturated bucket: one every 20 ms
const MANY = 20; // callers of flow A waiting at once
const FEW = 3; // callers of flow B (equal weights; 6 with weight 3)

/** The newest majors of both libraries (node-redis 6, ioredis 6). */
const NEWEST = LIBRARIES.filter((l) => l.major === 6);

async function waitFor(check, ms = 10_000) {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (await check()) return true;
    await new Promise((r) => setTimeout(r, 10));
  }
  return false;
}

/**
 * Callers that loop on `bucket.acquire(1, { flow, weight })` until `stop`
 * is set, pushing their flow's name onto `grants` at each grant.
 */
function callers(bucket, flow, weight, count, grants, state) {
  return Array.from({ length: count }, async () => {
    while (!state.stop) {
      const r = await bucket.acquire(1, { flow, weight, timeoutMs: 30_000 });
      assert.ok(r.allowed && r.retryAfterMs === 0, `a queued grant replies as a non-blocking one: ${r.reply}`);
      grants.push(flow);
    }
  });
}

/**
 * Flow A (MANY callers, weight 1) saturates a bucket; flow B (`few`
 * callers, weight `weightB`) joins. Once TB.INFO lists both flows waiting,
 * counts the next `n` grants; returns B's count and what TB.INFO said.
 */
async function share(limiter, key, weightB, few, n) {
  const bucket = limiter.bucket(key, String(RATE), 1);
  const grants = [];
  const state = { stop: false };
  const a = callers(bucket, 'A', 1, MANY, grants, state);
  try {
    assert.ok(await waitFor(async () => (await bucket.info())?.waiting >= MANY - 2), 'flow A waits on the bucket');
    const b = callers(bucket, 'B', weightB, few, grants, state);
    let seen = null;
    assert.ok(
      await waitFor(async () => {
        const info = await bucket.info();
        if (info && info.flows.length === 2) seen = info;
        return seen !== null;
      }),
      'both flows wait',
    );
    const from = grants.length;
    assert.ok(await waitFor(() => grants.length >= from + n, (n / RATE) * 1000 * 5), `${n} grants`);
    const window = grants.slice(from, from + n);
    state.stop = true;
    await Promise.all([...a, ...b]);
    return { b: window.filter((f) => f === 'B').length, info: seen };
  } finally {
    state.stop = true;
    await Promise.allSettled(a);
  }
}

describe('fair share on the module', () => {
  let server;
  let admin;
  before(async () => {
    server = await Server.start({ module: true });
    admin = new Redis(server.port, '127.0.0.1');
  });
  after(async () => {
    await admin?.quit();
    await server?.stop();
  });

  for (const lib of NEWEST) {
    describe(lib.name, () => {
      let client;
      let limiter;
      before(async () => {
        client = await lib.connect(server.port);
        limiter = new Limiter(client);
      });
      after(async () => {
        await limiter?.close();
        if (client) await lib.close(client);
      });

      test('equal weights: B with 3 callers gets half the grants against A with 20; TB.INFO lists both', async () => {
        await admin.flushall();
        const N = 100;
        const { b, info } = await share(limiter, 'fs:equal', 1, FEW, N);
        console.log(`${lib.name}: equal weights, B (${FEW} callers) got ${b} of ${N} grants against A (${MANY})`);
        assert.ok(Math.abs(b - N / 2) <= N / 10, `B got ${b} of ${N}`);
        const byName = Object.fromEntries(info.flows.map((f) => [f.name, f]));
        assert.deepEqual(Object.keys(byName).sort(), ['A', 'B']);
        assert.equal(byName.A.weight, 1);
        assert.equal(byName.B.weight, 1);
        assert.ok(byName.A.waiting >= 1 && byName.B.waiting >= 1 && byName.B.waiting <= FEW, JSON.stringify(info.flows));
        assert.equal(info.waiting, byName.A.waiting + byName.B.waiting, 'waiting counts every queued call');
      });

      test('weights 3:1: B gets three grants for each of A', async () => {
        await admin.flushall();
        const N = 200;
        const { b, info } = await share(limiter, 'fs:weighted', 3, 2 * FEW, N);
        const ratio = b / (N - b);
        console.log(`${lib.name}: weights 3:1, B got ${b} of ${N} grants (ratio ${ratio.toFixed(2)})`);
        // 3/4 of N, give or take N/20: a ratio from 2.6 to 3.5.
        assert.ok(Math.abs(b - (3 * N) / 4) <= N / 20, `B got ${b} of ${N}`);
        assert.equal(info.flows.find((f) => f.name === 'B')?.weight, 3);
      });

      test('nothing waits once the flows are served', async () => {
        await admin.flushall();
        const bucket = limiter.bucket('fs:idle', String(RATE), 1);
        await bucket.acquire(1, { flow: 'A', timeoutMs: 1000 });
        const info = await bucket.info();
        assert.equal(info?.waiting, 0);
        assert.deepEqual(info?.flows, []);
      });

      test('an aborted call leaves its flow at once and takes nothing', async () => {
        await admin.flushall();
        // The next token is 10 s away: a call still queued after the abort
        // would show in `waiting` for that long.
        const slow = limiter.bucket('fs:abort', '0.1', 1);
        assert.ok((await slow.consume()).allowed);
        const slot = limiter.bucket('fs:abort-slot', 0, 1);
        const held = await slot.lease(1, { ttlMs: 60_000 });
        for (const [bucket, call] of [
          [slow, (signal) => slow.acquire(1, { flow: 'A', timeoutMs: 30_000, signal })],
          [slot, (signal) => slot.lease(1, { ttlMs: 60_000, timeoutMs: 30_000, flow: 'A', signal })],
        ]) {
          const ac = new AbortController();
          const waiting = call(ac.signal);
          assert.ok(await waitFor(async () => (await bucket.info())?.waiting === 1), 'it waits');
          const t = Date.now();
          ac.abort(new Error('gone'));
          await assert.rejects(waiting, { message: 'gone' });
          assert.ok(await waitFor(async () => (await bucket.info())?.waiting === 0, 2000), 'it left the queue');
          console.log(`${lib.name}: an aborted call left the queue in ${Date.now() - t} ms`);
        }
        await slot.release(held.leaseId);
        assert.equal((await slot.info())?.tokens ?? 1, 1, 'the aborted lease took nothing');
      });

      test('leaseMany and acquireMany wait in a flow', async () => {
        await admin.flushall();
        const rpm = limiter.bucket('{fs}:rpm', '6000/m', 100);
        const slot = limiter.bucket('{fs}:slot', 0, 1);
        const first = await slot.lease(1, { ttlMs: 60_000 });
        const waiting = limiter.leaseMany([[rpm, 1], [slot, 1, 'slot']], { ttlMs: 60_000, timeoutMs: 10_000, flow: 'A' });
        assert.ok(await waitFor(async () => (await slot.info())?.flows.some((f) => f.name === 'A')), 'leaseMany waits in A');
        await slot.release(first.leaseId);
        const lease = await waiting;
        assert.ok(lease.result.allowed);
        await lease.done();
        const m = await limiter.acquireMany([[rpm, 1], [slot, 1]], { timeoutMs: 10_000, flow: 'B', weight: 2 });
        assert.ok(m.allowed && m.retryAfterMs === 0);
      });
    });
  }
});

describe('the Lua fallback takes the flow and ignores it', () => {
  let server;
  before(async () => {
    server = await Server.start({ module: false });
  });
  after(async () => {
    await server?.stop();
  });

  for (const lib of NEWEST) {
    test(lib.name, async () => {
      const client = await lib.connect(server.port);
      const limiter = new Limiter(client);
      try {
        const bucket = limiter.bucket('fs:lua', String(RATE), 1);
        // The first call finds out there is no module, with a flow on it.
        const first = await bucket.acquire(1, { flow: 'A', weight: 3, timeoutMs: 5000 });
        assert.equal(limiter.backend, 'lua');
        assert.ok(first.allowed);
        const second = await bucket.acquire(1, { flow: 'A', timeoutMs: 5000 });
        assert.ok(second.allowed);
        const lease = await bucket.lease(1, { ttlMs: 1000, timeoutMs: 5000, flow: 'B' });
        assert.ok(lease.allowed && lease.leaseId > 0);
        const many = await limiter.acquireMany([[bucket, 1]], { flow: 'B', timeoutMs: 5000 });
        assert.ok(many.allowed);
        const info = await bucket.info();
        assert.equal(info?.waiting, 0);
        assert.deepEqual(info?.flows, []);
      } finally {
        await limiter.close();
        await lib.close(client);
      }
    });
  }
});

describe('BullMQ: a processor takes its flow from the job', () => {
  let server;
  let connection;
  let limiter;
  before(async () => {
    server = await Server.start({ module: true });
    connection = new Redis(server.port, '127.0.0.1', { maxRetriesPerRequest: null });
    limiter = new Limiter(new Redis(server.port, '127.0.0.1'));
  });
  after(async () => {
    await limiter?.close();
    limiter?.client.disconnect();
    connection?.disconnect();
    await server?.stop();
  });

  test("a tenant's few jobs are not stuck behind another tenant's backlog", async () => {
    await connection.flushall();
    const name = 'fair';
    const bucket = limiter.bucket('fs:bullmq', '20', 1); // one shared quota: a grant every 50 ms
    const order = []; // tenants in the order their jobs were granted
    const asked = new Map(); // job id -> grants made before the job asked
    const queue = new Queue(name, { connection });
    const events = new QueueEvents(name, { connection });
    await events.waitUntilReady();
    const worker = new Worker(
      name,
      limitProcessor(
        bucket,
        async (job) => {
          order.push(job.data.tenant);
          return order.length - 1;
        },
        {
          flow: (job) => {
            asked.set(job.id, order.length);
            return job.data.tenant;
          },
          maxWaitMs: 10_000,
        },
      ),
      { connection, concurrency: 12 },
    );
    try {
      const jobs = await queue.addBulk([
        ...Array.from({ length: 30 }, (_, i) => ({ name: 'call', data: { tenant: 'acme', i } })),
        ...Array.from({ length: 4 }, (_, i) => ({ name: 'call', data: { tenant: 'globex', i } })),
      ]);
      const granted = [];
      for (const job of jobs) granted.push(await job.waitUntilFinished(events));
      assert.equal(order.length, 34);
      // A globex job asks while up to 11 acme jobs wait before it: first come
      // first served would grant it after all of them. In its own flow, the
      // flows take turns: between its asking and its grant, acme gets at
      // most one grant per globex grant (its own and those of the globex
      // jobs ahead of it), plus one on its way when it asked.
      const spans = jobs.slice(30).map((job, j) => order.slice(asked.get(job.id), granted[30 + j]));
      const acme = spans.map((s) => s.filter((t) => t === 'acme').length);
      const globex = spans.map((s) => s.filter((t) => t === 'globex').length);
      console.log(`BullMQ: acme grants while each globex job waited: ${acme.join(', ')} (globex ahead: ${globex.join(', ')})`);
      acme.forEach((n, j) => assert.ok(n <= globex[j] + 2, `globex job ${j} waited through ${n} acme grants: ${acme}`));
    } finally {
      await worker.close();
      await events.close();
      await queue.close();
    }
  });

  /** Runs `jobs` (data) through `processor` on one worker; returns the finished jobs. */
  async function run(name, processor, jobs, concurrency) {
    const queue = new Queue(name, { connection });
    const events = new QueueEvents(name, { connection });
    await events.waitUntilReady();
    const worker = new Worker(name, processor, { connection, concurrency });
    try {
      const added = await queue.addBulk(jobs.map((data) => ({ name: 'call', data })));
      const values = [];
      for (const job of added) values.push(await job.waitUntilFinished(events));
      return { values, jobs: await Promise.all(added.map((j) => queue.getJob(j.id))) };
    } finally {
      await worker.close();
      await events.close();
      await queue.close();
    }
  }

  test('a job whose wait in its flow runs out is delayed, holding nothing, then served', async () => {
    await connection.flushall();
    const bucket = limiter.bucket('fs:bullmq-slow', '4', 1); // a grant every 250 ms
    const { values, jobs } = await run(
      'fair-delayed',
      limitProcessor(bucket, async (job) => job.data.i, { flow: (job) => job.data.tenant, maxWaitMs: 100 }),
      [0, 1, 2, 3].map((i) => ({ tenant: i % 2 ? 'b' : 'a', i })),
      4,
    );
    assert.deepEqual(values, [0, 1, 2, 3]);
    const starts = jobs.map((j) => j?.attemptsStarted ?? 0);
    console.log(`BullMQ: starts per job with a wait of 100 ms on a grant every 250 ms: ${starts.join(', ')}`);
    assert.ok(starts.some((n) => n > 1), `some job was delayed: ${starts}`);
  });

  test('leaseProcessor: jobs wait for a slot in their tenant\'s flow', async () => {
    await connection.flushall();
    const slot = limiter.bucket('fs:bullmq-slot', 0, 1); // one call at a time
    let most = 0;
    const { values } = await run(
      'fair-leased',
      leaseProcessor(
        [[slot, 1, 'slot']],
        async (job) => {
          await new Promise((r) => setTimeout(r, 100));
          most = Math.max(most, (await slot.info())?.flows.length ?? 0);
          return job.data.i;
        },
        { ttlMs: 10_000, flow: (job) => job.data.tenant, weight: (job) => (job.data.tenant === 'a' ? 2 : 1) },
      ),
      [0, 1, 2, 3, 4, 5].map((i) => ({ tenant: i % 2 ? 'b' : 'a', i })),
      6,
    );
    assert.deepEqual(values, [0, 1, 2, 3, 4, 5]);
    assert.equal(most, 2, 'both tenants waited for the slot while a job held it');
  });
});
