// Mixed fleet: a Celery worker (the Python client, prefork, 4 processes)
// and BullMQ workers (the Node client, 2 processes) call one API through
// one shared bucket, with a backlog deeper than the longest wait. Together
// they keep the limit: every call has its token from that one bucket, the
// tokens go first come first served whoever asks, and the calls are spaced
// by the limit. (Which side gets the turns in between is the bucket's
// first come, first served: a side whose denied jobs come back sooner asks
// sooner. The order of the calls is printed.)
//
// TB_PYTHON is the Python of the client's venv (make python-venv), with
// Celery and tb_limiter installed.

import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { Queue } from 'bullmq';
import Redis from 'ioredis';

import { Proc, Referee, matchGrants, median, startAll, startNodeWorker, summary } from '../helpers/fleet.js';
import { Server } from '../helpers/server.js';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const WORKER = fileURLToPath(new URL('../fixtures/bullmq-worker.js', import.meta.url));
const RATE = 4; // one call every 250 ms, for the whole mixed fleet
const INTERVAL_MS = 1000 / RATE;
const MAX_WAIT_MS = 1000;
const PER_SIDE = 8; // 16 calls: a 4 s backlog, deeper than MAX_WAIT_MS
// Calls may start late by their worker's scheduling, never before their
// token. Celery adds its own: a requeued task is delivered by the worker's
// timer and then needs a free prefork process, which on a loaded 2-core
// machine takes up to a few hundred milliseconds more than a BullMQ delayed
// job (see test/bullmq.test.js for the Node side alone). These bounds only
// catch a broken design (a task coming back a whole second late); the
// figures are printed.
const MEDIAN_LATE_MS = 50;
const MAX_LATE_MS = 1000;

function python() {
  const py = process.env.TB_PYTHON;
  if (!py || !existsSync(py)) {
    throw new Error(`TB_PYTHON (${py}) is not the Python client's venv: run 'make test-node', which creates it`);
  }
  return py;
}

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

test('a Celery worker and BullMQ workers share one bucket and together keep the limit', async () => {
  const py = python();
  const referee = await Referee.start();
  const repliesDir = mkdtempSync(path.join(tmpdir(), 'tb-mixed-'));
  const redisUrl = `redis://127.0.0.1:${server.port}/0`;
  const celeryEnv = {
    TB_REDIS_URL: redisUrl,
    REFEREE_URL: referee.url,
    RATE: String(RATE),
    MAX_WAIT_MS: String(MAX_WAIT_MS),
    TB_REPLIES_DIR: repliesDir,
  };
  const nodeEnv = {
    REDIS_PORT: String(server.port),
    QUEUE: 'mixed',
    REFEREE_URL: referee.url,
    RATE: String(RATE),
    CAPACITY: '1',
    MAX_WAIT_MS: String(MAX_WAIT_MS),
    CONCURRENCY: '4',
    MODE: 'shared',
  };
  const procs = [];
  try {
    await startAll(
      [
        Proc.start(
          py,
          ['-m', 'celery', '-A', 'celery_app', 'worker', '--pool=prefork', '--concurrency=4',
            '--without-gossip', '--without-mingle', '--without-heartbeat', '--loglevel=INFO'],
          { cwd: HERE, env: celeryEnv, ready: ' ready.', detached: true },
        ),
        startNodeWorker(WORKER, { ...nodeEnv, CLIENT: 'ioredis' }),
        startNodeWorker(WORKER, { ...nodeEnv, CLIENT: 'node-redis' }),
      ],
      procs,
    );

    // Both sides enqueue at the same moment: the Celery producer is loaded
    // first and sends when told.
    const producer = await Proc.start(
      py,
      ['-c', `import sys\nfrom celery_app import call_api\nprint('loaded', flush=True)\nsys.stdin.readline()\n` +
        `for i in range(${PER_SIDE}): call_api.delay(i)\nprint('sent', flush=True)\n`],
      { cwd: HERE, env: celeryEnv, ready: 'loaded', stdin: true },
    );
    procs.push(producer);
    const queue = new Queue('mixed', { connection: { host: '127.0.0.1', port: server.port } });
    await queue.waitUntilReady();
    producer.child.stdin.write('\n');
    await Promise.all([
      queue.addBulk(Array.from({ length: PER_SIDE }, (_, seq) => ({ name: 'call', data: { tenant: 'shared', seq } }))),
      producer.exited,
    ]);
    assert.match(producer.output, /sent/);
    await referee.waitForCalls(2 * PER_SIDE, 2 * PER_SIDE * INTERVAL_MS + 30_000);
    await new Promise((r) => setTimeout(r, INTERVAL_MS * 2)); // anything run twice shows up
    const counts = await queue.getJobCounts('completed', 'failed');
    await queue.close();
    await Promise.all(procs.map((p) => p.stop())); // the BullMQ workers report their replies

    const replies = [...referee.replies];
    for (const f of readdirSync(repliesDir)) {
      for (const line of readFileSync(path.join(repliesDir, f), 'utf8').split('\n').filter(Boolean)) {
        const r = JSON.parse(line);
        replies.push({ ...r, sendNs: BigInt(r.sendNs), recvNs: BigInt(r.recvNs) });
      }
    }
    const calls = referee.calls;
    const bySide = (side) => calls.filter((c) => c.side === side);
    assert.equal(bySide('celery').length, PER_SIDE, 'every Celery task called once');
    assert.equal(bySide('bullmq').length, PER_SIDE, 'every BullMQ job called once');
    assert.equal(new Set(calls.map((c) => c.job)).size, 2 * PER_SIDE);
    assert.deepEqual([counts.completed, counts.failed], [PER_SIDE, 0]);
    assert.ok(new Set(bySide('celery').map((c) => c.pid)).size >= 1);

    const shared = replies.filter((r) => r.key === 'api:shared');
    const m = matchGrants(calls, shared.filter((r) => r.allowed));
    const denials = shared.filter((r) => !r.allowed);
    const order = calls.slice().sort((a, b) => (a.startNs < b.startNs ? -1 : 1)).map((c) => c.side[0]).join('');
    console.log(
      `# mixed fleet: ${calls.length} calls (celery ${PER_SIDE}, bullmq ${PER_SIDE}; order ${order}), ` +
        `gaps ms ${JSON.stringify(summary(m.gaps))}, late ms ${JSON.stringify(summary(m.lateness))} ` +
        `(median ${median(m.lateness)}), without a token ${m.without}, unused tokens ${m.unused}, ` +
        `out of turn ${m.outOfTurn}, denied asks ${denials.length} ` +
        `(celery ${denials.filter((d) => d.job.startsWith('celery:')).length})`,
    );
    const latest = m.lateBy.reduce((a, b) => (b.ms > a.ms ? b : a), { ms: -Infinity });
    console.log(`# latest call: ${latest.call?.side} job seq ${latest.call?.seq}, ${Math.round(latest.ms)} ms after its token`);
    assert.equal(m.without, 0, 'calls without a token');
    assert.equal(m.unused, 0, 'tokens taken and never used');
    assert.equal(m.outOfTurn, 0, 'calls out of the order their jobs asked the bucket');
    const late = m.lateness.slice().sort((a, b) => a - b);
    assert.ok(late[Math.floor(late.length / 2)] <= MEDIAN_LATE_MS, `late by ${late}`);
    assert.ok(late.at(-1) <= MAX_LATE_MS, `late by ${late}`);
    // The whole rate used: see test/bullmq.test.js.
    const span = (calls.length - 1) * INTERVAL_MS + Math.max(...m.sinceEarliest);
    assert.ok(m.spanMs <= span, `span ${m.spanMs} > ${span}`);
  } finally {
    await Promise.all(procs.map((p) => p.stop()));
    await referee.close();
    rmSync(repliesDir, { recursive: true, force: true });
  }
});
