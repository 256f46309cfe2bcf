// BullMQ end to end: real workers in two Node processes (one limiter on
// ioredis, the other on node-redis) against a real server, a backlog deeper
// than the longest wait, and the referee API checking every call.

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { Queue } from 'bullmq';
import Redis from 'ioredis';

import { Referee, inversions, matchGrants, median, startAll, startNodeWorker, summary } from './helpers/fleet.js';
import { Server } from './helpers/server.js';

const WORKER = fileURLToPath(new URL('./fixtures/bullmq-worker.js', import.meta.url));
const RATE = 4; // tokens per second: one call every 250 ms per bucket
const INTERVAL_MS = 1000 / RATE;
const MAX_WAIT_MS = 1000; // the longest wait a job may reserve ...
const JOBS = 10; // ... per bucket: a backlog of 2.5 s, deeper than it
// A call may start after its token is due by the time its worker takes to
// get to it: a timer, an event loop shared with the other jobs, a loaded
// 2-core machine (the first calls, while both workers take their first
// jobs at once, are the latest). Never before. Half the calls must start
// within MEDIAN_LATE_MS of their token, and none later than the lead a
// delayed job comes back with (250 ms): later would mean the design failed
// (the job came back from the delayed set past its turn).
const MEDIAN_LATE_MS = 10;
const MAX_LATE_MS = 250;

for (const backend of ['module', 'lua']) {
  describe(`BullMQ with ${backend === 'module' ? 'the module' : 'the Lua fallback'}`, () => {
    let server;
    let referee;
    let workers = [];
    let admin;

    before(async () => {
      server = await Server.start({ module: backend === 'module' });
      admin = new Redis(server.port, '127.0.0.1');
    });
    after(async () => {
      await admin?.quit();
      await server?.stop();
    });

    async function run(mode, queueName, jobs) {
      await admin.flushall();
      referee = await Referee.start();
      const env = {
        REDIS_PORT: String(server.port),
        QUEUE: queueName,
        REFEREE_URL: referee.url,
        RATE: String(RATE),
        CAPACITY: '1',
        MAX_WAIT_MS: String(MAX_WAIT_MS),
        CONCURRENCY: '4',
        MODE: mode,
      };
      try {
        workers = [];
        await startAll(
          [startNodeWorker(WORKER, { ...env, CLIENT: 'ioredis' }), startNodeWorker(WORKER, { ...env, CLIENT: 'node-redis' })],
          workers,
        );
        const queue = new Queue(queueName, { connection: { host: '127.0.0.1', port: server.port } });
        const startedNs = process.hrtime.bigint();
        await queue.addBulk(jobs.map((data) => ({ name: 'call', data })));
        const buckets = new Set(jobs.map((j) => j.tenant)).size;
        await referee.waitForCalls(jobs.length, (jobs.length / buckets) * INTERVAL_MS + 20_000);
        // Let anything that would run twice show up.
        await new Promise((r) => setTimeout(r, INTERVAL_MS * 2));
        const counts = await queue.getJobCounts('completed', 'failed', 'delayed', 'wait', 'active');
        await queue.close();
        // The workers report the grants they saw when they stop.
        await Promise.all(workers.map((w) => w.stop()));
        return { calls: [...referee.calls], replies: [...referee.replies], counts, startedNs };
      } finally {
        await Promise.all(workers.map((w) => w.stop()));
        await referee.close();
      }
    }

    /** Checks and prints each bucket's figures; returns them. */
    function check(name, byBucket, replies) {
      const out = new Map();
      for (const [bucket, list] of byBucket) {
        const mine = replies.filter((g) => g.key === bucket);
        const m = matchGrants(list, mine.filter((g) => g.allowed));
        m.denials = mine.filter((g) => !g.allowed).length;
        const order = list
          .slice()
          .sort((a, b) => (a.startNs < b.startNs ? -1 : 1))
          .map((x) => x.seq);
        m.inversions = inversions(order);
        console.log(
          `# ${name}, ${backend}, ${bucket}: ${list.length} calls, gaps ms ${JSON.stringify(summary(m.gaps))}, ` +
            `late ms ${JSON.stringify(summary(m.lateness))} (median ${median(m.lateness)}), without a token ${m.without}, ` +
            `unused tokens ${m.unused}, out of turn ${m.outOfTurn}, denied asks ${m.denials}, ` +
            `enqueue-order inversions ${m.inversions}`,
        );
        assert.equal(m.without, 0, `${bucket}: calls without a token`);
        assert.equal(m.unused, 0, `${bucket}: tokens taken and never used`);
        assert.equal(m.outOfTurn, 0, `${bucket}: calls out of the order their jobs asked the bucket`);
        const late = m.lateness.slice().sort((a, b) => a - b);
        assert.ok(late[Math.floor(late.length / 2)] <= MEDIAN_LATE_MS, `${bucket}: late by ${late}`);
        assert.ok(late.at(-1) <= MAX_LATE_MS, `${bucket}: late by ${late}`);
        // The fleet uses the whole rate: the tokens of a backlog are due
        // exactly one interval apart, so the calls span those intervals plus
        // at most how late the last one started (measured from the earliest
        // its token could have been due: the reply's round trip is unknown).
        const span = (list.length - 1) * INTERVAL_MS + Math.max(...m.sinceEarliest);
        assert.ok(m.spanMs <= span, `${bucket}: span ${m.spanMs} > ${span}`);
        out.set(bucket, m);
      }
      return out;
    }

    test('per-tenant buckets: exact spacing, no call without a token, no tenant held up', async () => {
      const jobs = [];
      for (let seq = 0; seq < JOBS; seq++) for (const tenant of ['a', 'b']) jobs.push({ tenant, seq });
      const { calls, replies, counts } = await run('tenant', `tenants-${backend}`, jobs);
      assert.equal(calls.length, jobs.length, 'each job called the API once');
      assert.equal(new Set(calls.map((c) => c.job)).size, jobs.length);
      assert.deepEqual([counts.completed, counts.failed], [jobs.length, 0]);
      for (const c of calls) assert.equal(c.data.tbReservation, undefined, 'the processor sees its own data');
      const byTenant = new Map(['a', 'b'].map((t) => [`api:tenant:${t}`, calls.filter((c) => c.tenant === t)]));
      check('per-tenant', byTenant, replies);
      // Both tenants ran side by side: neither waited for the other's
      // backlog (each one's calls span (JOBS - 1) intervals; a tenant held up
      // behind the other would start that much later).
      const first = (list) => Math.min(...list.map((c) => Number(c.startNs) / 1e6));
      const [a, b] = [...byTenant.values()];
      const apart = Math.abs(first(a) - first(b));
      assert.ok(apart < ((JOBS - 1) * INTERVAL_MS) / 2, `the tenants' first calls ${apart} ms apart`);
    });

    test('queue-wide bucket: exact spacing, first come first served, no call without a token', async () => {
      const jobs = [];
      for (let seq = 0; seq < JOBS; seq++) jobs.push({ tenant: 'all', seq });
      const { calls, replies, counts } = await run('queue', `queue-${backend}`, jobs);
      assert.equal(calls.length, jobs.length);
      assert.deepEqual([counts.completed, counts.failed], [jobs.length, 0]);
      check('queue-wide', new Map([['api:queue', calls]]), replies);
    });
  });
}
