// Every ACL user the docs document for the limiter runs every documented
// Node recipe (issue 18 item 2). The users come from the docs themselves:
// each `user NAME ...` line of a block whose doctest directive gives NAME
// the `limiter` suite (`acl=NAME:limiter:...`) is applied with ACL SETUSER
// (`default` under another name, so the harness keeps its admin). Then,
// logged in as that user (node-redis for the limiter, an admin connection
// for BullMQ's own queue): consume, reserve, acquire (timer, BLOCK, and in
// a flow), refund, info, consumeMany, acquireMany (and in a flow), a lease
// released and one settled, withLease (and in a flow), withLeases, a
// batched bucket, and BullMQ's limitProcessor (in a flow) and
// leaseProcessor.

import assert from 'node:assert/strict';
import { existsSync, readFileSync, readdirSync, statSync } from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import { Queue, QueueEvents, Worker } from 'bullmq';
import Redis from 'ioredis';
import { createClient } from 'redis';
import { Limiter } from 'tb-limiter';
import { leaseProcessor, limitProcessor } from 'tb-limiter/bullmq';

import { REPO, Server } from './helpers/server.js';

function docFiles() {
  const out = [path.join(REPO, 'README.md')];
  const walk = (dir) => {
    for (const name of readdirSync(dir)) {
      const p = path.join(dir, name);
      if (statSync(p).isDirectory()) walk(p);
      else if (name.endsWith('.md')) out.push(p);
    }
  };
  walk(path.join(REPO, 'docs'));
  for (const top of ['clients', 'examples']) {
    for (const name of readdirSync(path.join(REPO, top))) {
      const p = path.join(REPO, top, name, 'README.md');
      if (existsSync(p)) out.push(p);
    }
  }
  return out;
}

/** The documented limiter users: { name, rules, where }. */
function limiterUsers() {
  const users = [];
  for (const file of docFiles()) {
    const lines = readFileSync(file, 'utf8').split('\n');
    for (let i = 0; i < lines.length; i++) {
      const d = /<!--\s*doctest:([^>]*)-->/.exec(lines[i]);
      if (!d) continue;
      const wanted = [...d[1].matchAll(/\bacl=([^:\s]+):([^:\s]*)/g)]
        .filter((m) => m[2].split(',').includes('limiter'))
        .map((m) => m[1]);
      if (wanted.length === 0) continue;
      for (let k = i + 2; k < lines.length && !/^\s*```\s*$/.test(lines[k]); k++) {
        const m = /^\s*user\s+(\S+)\s+(.*)$/.exec(lines[k]);
        if (m && wanted.includes(m[1])) {
          users.push({ name: m[1], rules: m[2].trim().split(/\s+/), where: `${path.relative(REPO, file)}:${k + 1}` });
        }
      }
    }
  }
  return users;
}

const USERS = limiterUsers();

let server;
let admin;
before(async () => {
  server = await Server.start({ module: true });
  admin = new Redis(server.port, '127.0.0.1', { maxRetriesPerRequest: null });
});
after(async () => {
  admin?.disconnect();
  await server?.stop();
});

test('the docs document limiter users', () => {
  assert.ok(USERS.some((u) => u.name === 'limiter'), JSON.stringify(USERS));
});

for (const user of USERS) {
  describe(`${user.name} (${user.where})`, () => {
    const name = user.name === 'default' ? 'doc-default' : user.name;
    const password = (user.rules.find((r) => r.startsWith('>')) ?? '>x').slice(1);
    const pattern = user.rules.find((r) => r.startsWith('~'));
    // A key the user's first pattern allows: `~rl:*` -> `rl:...`.
    const prefix = pattern ? pattern.slice(1).replace(/\*.*$/, '') : '';
    const key = (k) => `${prefix}${k}`;
    let client;
    let limiter;
    before(async () => {
      await admin.call('ACL', 'SETUSER', name, 'reset', ...user.rules);
      client = createClient({ url: `redis://127.0.0.1:${server.port}`, username: name, password });
      await client.connect();
      limiter = new Limiter(client);
    });
    after(async () => {
      await limiter?.close();
      await client?.quit();
      await admin.call('ACL', 'DELUSER', name);
    });

    test('every documented recipe runs as this user', async () => {
      const done = [];
      const step = async (what, fn) => {
        try {
          await fn();
          done.push(what);
        } catch (e) {
          throw new Error(`${what} as ${name}: ${e.message}`, { cause: e });
        }
      };
      // A slow refill: a full bucket's key expires, and info() must find it.
      const b = limiter.bucket(key('api'), '1/m', 10);
      await step('consume', async () => assert.ok((await b.consume()).allowed));
      await step('reserve', async () => assert.ok((await b.reserve(1, { maxWaitMs: 1000 })).allowed));
      await step('acquire', async () => assert.ok((await b.acquire(1, { timeoutMs: 1000 })).allowed));
      await step('acquire block', async () => assert.ok((await b.acquire(1, { timeoutMs: 1000, block: true })).allowed));
      await step('acquire in a flow', async () => assert.ok((await b.acquire(1, { timeoutMs: 1000, flow: 'acme', weight: 2 })).allowed));
      await step('refund', async () => assert.notEqual(await b.refund(1), undefined));
      await step('info', async () => assert.equal((await b.info())?.capacity, 10));
      const rpm = limiter.bucket(key('{t}:rpm'), '500/m', 500);
      const tpm = limiter.bucket(key('{t}:tpm'), '30000/m', 30000);
      const slots = limiter.bucket(key('{t}:inflight'), 0, 8);
      await step('consumeMany', async () => assert.ok((await limiter.consumeMany([[rpm, 1], [tpm, 100]])).allowed));
      await step('acquireMany', async () => assert.ok((await limiter.acquireMany([[rpm, 1], [tpm, 100]], { timeoutMs: 1000 })).allowed));
      await step('acquireMany in a flow', async () =>
        assert.ok((await limiter.acquireMany([[rpm, 1], [tpm, 100]], { timeoutMs: 1000, flow: 'acme' })).allowed),
      );
      await step('lease and release', async () => {
        const r = await slots.lease(1, { ttlMs: 60_000 });
        assert.equal(await slots.release(r.leaseId), 1);
      });
      await step('lease and settle', async () => {
        const r = await tpm.lease(2000, { ttlMs: 60_000 });
        assert.equal(await tpm.settle(r.leaseId, 2600), -600);
      });
      await step('withLease', async () => slots.withLease(1, { ttlMs: 60_000 }, async () => 'ok'));
      await step('withLease in a flow', async () => slots.withLease(1, { ttlMs: 60_000, flow: 'acme' }, async () => 'ok'));
      await step('withLeases', async () =>
        limiter.withLeases([[rpm, 1], [tpm, 2000, 'estimate'], [slots, 1, 'slot']], { ttlMs: 60_000 }, async (lease) => {
          lease.used = 1500;
        }),
      );
      assert.equal((await slots.info())?.tokens ?? 8, 8, 'every slot came back');
      await step('batched', async () => {
        const local = limiter.bucket(key('hot'), '1000', 100).batched(10);
        assert.ok((await local.consume(1))?.allowed, 'a batch taken');
        assert.equal(await local.consume(1), null, 'served from the batch');
        await local.close(); // the rest refunded
      });
      await step('BullMQ limitProcessor and leaseProcessor', async () => {
        const qname = `acl-${name}`;
        const queue = new Queue(qname, { connection: admin });
        const events = new QueueEvents(qname, { connection: admin });
        await events.waitUntilReady();
        const limited = limitProcessor(limiter.bucket(key('bull'), '100', 1), async () => 'limited', { flow: () => 'acme' });
        const leased = leaseProcessor([[rpm, 1], [tpm, 100, 'estimate'], [slots, 1, 'slot']], async (_j, _t, _s, lease) => {
          lease.used = 50;
          return 'leased';
        }, { ttlMs: 60_000 });
        const worker = new Worker(qname, (job, token, signal) => (job.name === 'leased' ? leased : limited)(job, token, signal), {
          connection: admin,
          concurrency: 2,
        });
        try {
          const jobs = await queue.addBulk([{ name: 'limited', data: {} }, { name: 'leased', data: {} }]);
          const out = [];
          for (const j of jobs) out.push(await j.waitUntilFinished(events));
          assert.deepEqual(out, ['limited', 'leased']);
        } finally {
          await Promise.all([worker.close(), events.close(), queue.close()]);
        }
      });
      assert.equal(limiter.backend, 'module');
      assert.equal(done.length, 17);
    });
  });
}
