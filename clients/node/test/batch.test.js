// Hot-key batches (Batcher): tokens handed out locally, given back when idle,
// on close, and at the latest maxHoldMs after they were taken.

import assert from 'node:assert/strict';
import { beforeEach, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';

import { Limiter } from 'tb-limiter';

import { LIBRARIES } from './helpers/clients.js';
import { BACKENDS, servers } from './helpers/fixtures.js';

const NO_REFILL = '1e-12'; // a token every 30,000 years: counts are exact
const env = servers();
const lib = LIBRARIES[0];

for (const backend of BACKENDS) {
  describe(`batches, ${lib.name}, ${backend}`, () => {
    let client;
    let limiter;

    beforeEach(async (t) => {
      await env.admin(backend).flushall();
      client = await lib.connect(env.server(backend).port);
      limiter = new Limiter(client);
      t.after(async () => {
        await limiter.close();
        await lib.close(client);
      });
    });

    const tokens = async (b) => (await b.info()).tokens;

    test('concurrent requests share one call per batch; close gives back', async () => {
      const b = limiter.bucket('hot:a', NO_REFILL, 100);
      const local = b.batched(10, { holdMs: 5000, maxHoldMs: 5000 });
      const replies = await Promise.all(Array.from({ length: 25 }, () => local.consume()));
      assert.equal(replies.filter((r) => r !== null).length, 3, 'one call per batch');
      assert.deepEqual([local.handedOut, local.batches, local.held], [25, 3, 5]);
      assert.equal(Math.floor(await tokens(b)), 70);
      await local.close();
      assert.equal(Math.floor(await tokens(b)), 75, 'the 5 held came back');
      await assert.rejects(local.consume(), /closed/);
    });

    test('an idle batch goes back after holdMs', async () => {
      const b = limiter.bucket('hot:idle', NO_REFILL, 100);
      const local = b.batched(10, { holdMs: 30, maxHoldMs: 5000 });
      await local.consume();
      const deadline = Date.now() + 10_000;
      while (Math.floor(await tokens(b)) < 99) {
        assert.ok(Date.now() < deadline, 'the idle batch never came back');
        await sleep(10);
      }
      assert.equal(local.held, 0);
      await local.close();
    });

    test('a batch in use goes back once maxHoldMs has passed', async () => {
      const b = limiter.bucket('hot:max', NO_REFILL, 1000);
      const local = b.batched(1000, { holdMs: 300, maxHoldMs: 300 });
      await local.consume();
      const first = Date.now();
      const deadline = first + 10_000;
      while (local.batches < 2) {
        assert.ok(Date.now() < deadline, 'the batch was held past maxHoldMs');
        await local.consume();
        await sleep(5);
      }
      assert.ok(Date.now() - first >= 300, 'given back before maxHoldMs');
      assert.ok(local.handedOut < 1000, 'only maxHoldMs could have ended the first batch');
      await local.close();
      assert.equal(Math.floor(await tokens(b)), 1000 - local.handedOut);
    });

    test('acquire waits; bad batches are refused', async () => {
      const b = limiter.bucket('hot:acq', 100, 5);
      const local = b.batched(5);
      for (let i = 0; i < 6; i++) await local.acquire(1, { timeoutMs: 5000 });
      assert.equal(local.handedOut, 6);
      await local.close();
      assert.throws(() => b.batched(0), RangeError);
      assert.throws(() => b.batched(6), RangeError);
      assert.throws(() => b.batched(2, { holdMs: 10, maxHoldMs: 5 }), RangeError);
    });
  });
}
