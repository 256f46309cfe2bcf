// Waiting for a lease on the server (`lease(n, { block: true })` and
// `leaseMany(parts, { block: true })`): one call per grant on the module, first come first served; polling on
// the Lua fallback, which cannot hold a reply.

import assert from 'node:assert/strict';
import { beforeEach, describe, test } from 'node:test';

import { Limiter } from 'tb-limiter';

import { LIBRARIES } from './helpers/clients.js';
import { BACKENDS, info, limiterCalls, servers } from './helpers/fixtures.js';

const env = servers();

async function waitFor(check, ms = 5000) {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (await check()) return true;
    await new Promise((r) => setTimeout(r, 10));
  }
  return false;
}

for (const lib of LIBRARIES) {
  for (const backend of BACKENDS) {
    describe(`${lib.name}, ${backend}: lease with block`, () => {
      let client;
      let limiter;
      let admin;

      beforeEach(async (t) => {
        admin = env.admin(backend);
        await admin.flushall();
        client = await lib.connect(env.server(backend).port);
        limiter = new Limiter(client);
        t.after(async () => {
          await limiter.close();
          await lib.close(client);
        });
      });

      test('waiters are granted in arrival order as slots come back', async () => {
        const slot = limiter.bucket('lw:slot', 0, 1);
        const first = await slot.lease(1, { ttlMs: 60000 });
        assert.ok(first.allowed);
        const before = await limiterCalls(admin);
        const order = [];
        const waiters = [0, 1, 2].map(async (i) => {
          if (backend === 'module') {
            // Arrive in order: each waits on the server before the next is sent.
            await waitFor(async () => Number((await info(admin, 'tb')).tb_blocked_now) === i);
          }
          const r = await slot.lease(1, { ttlMs: 60000, timeoutMs: 10000, block: true });
          order.push(i);
          await new Promise((res) => setTimeout(res, 20));
          await slot.release(r.leaseId);
          return r;
        });
        if (backend === 'module') {
          assert.ok(await waitFor(async () => Number((await info(admin, 'tb')).tb_blocked_now) === 3), 'all wait');
        }
        await slot.release(first.leaseId);
        const got = await Promise.all(waiters);
        assert.ok(got.every((r) => r.allowed));
        const calls = (await limiterCalls(admin)) - before;
        if (backend === 'module') {
          assert.deepEqual(order, [0, 1, 2], 'first come first served');
          assert.equal(calls, 3, 'one TB.CONSUME per grant');
        } else {
          assert.ok(calls >= 3, 'polled');
        }
      });

      test('leaseMany waits for all its parts in one call', async () => {
        const rpm = limiter.bucket('{lw}:rpm', '600/m', 600);
        const slot = limiter.bucket('{lw}:slot', 0, 1);
        const first = await slot.lease(1, { ttlMs: 60000 });
        assert.ok(first.allowed);
        const before = await limiterCalls(admin);
        const waiting = limiter.leaseMany([[rpm, 1], [slot, 1, 'slot']], { ttlMs: 60000, timeoutMs: 10000, block: true });
        if (backend === 'module') {
          assert.ok(await waitFor(async () => Number((await info(admin, 'tb')).tb_blocked_now) === 1), 'it waits');
        }
        await slot.release(first.leaseId);
        const lease = await waiting;
        assert.ok(lease.result.allowed);
        const calls = (await limiterCalls(admin)) - before;
        if (backend === 'module') assert.equal(calls, 1, 'one TB.MCONSUME for the wait and the grant');
        await lease.done();
        assert.equal((await slot.info())?.tokens ?? 1, 1, 'the slot came back');
      });
    });
  }
}
