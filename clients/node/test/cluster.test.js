// Cluster clients of both libraries (node-redis createCluster, ioredis
// Cluster), on a real three-master cluster with the module and on one
// without (the Lua fallback): every method, routed by key with no MOVED.

import assert from 'node:assert/strict';
import { after, before, beforeEach, describe, test } from 'node:test';

import { CommandError, Limiter } from 'tb-limiter';

import { LIBRARIES } from './helpers/clients.js';
import { Cluster } from './helpers/cluster.js';

const FROZEN = '1e-12';
// Keys served by each of the three masters (slots 0-5460, 5461-10922, 10923-16383).
const KEYS = ['{a}', '{b}', '{c}'].map((tag) => `${tag}:bucket`);

const clusters = {};
before(async () => {
  clusters.module = await Cluster.start({ module: true });
  clusters.lua = await Cluster.start({ module: false });
});
after(async () => {
  await clusters.module?.stop();
  await clusters.lua?.stop();
});

for (const lib of LIBRARIES) {
  for (const backend of ['module', 'lua']) {
    describe(`${lib.name} cluster, ${backend}`, () => {
      let cluster;
      let client;
      let limiter;
      beforeEach(async (t) => {
        cluster = clusters[backend];
        client = await lib.connectCluster(cluster.ports);
        limiter = new Limiter(client);
        await cluster.reset();
        t.after(async () => {
          await limiter.close();
          await lib.close(client);
        });
      });

      test('every method, routed to the key\'s node without a redirection', async () => {
        const nodes = new Set();
        for (const key of KEYS) {
          const b = limiter.bucket(key, FROZEN, 5);
          assert.equal((await b.consume(2)).remaining, 3);
          assert.equal((await b.peek()).allowed, true);
          assert.equal((await b.reserve(1, { maxWaitMs: 1000 })).remaining, 2);
          assert.equal(await b.refund(1), 3);
          assert.equal((await b.info()).capacity, 5);
          const admin = await cluster.adminFor(key);
          assert.equal(await admin.exists(key), 1, `${key} is on the node that serves it`);
          nodes.add(admin);
        }
        assert.equal(nodes.size, 3, 'the keys live on three masters');
        const rpm = limiter.bucket('{t42}:rpm', FROZEN, 3);
        const tpm = limiter.bucket('{t42}:tpm', FROZEN, 1000);
        assert.deepEqual((await limiter.consumeMany([[rpm, 1], [tpm, 600]])).remaining, [2, 400]);
        assert.equal(limiter.backend, backend);
        assert.equal(await cluster.redirections(), 0, 'no MOVED: every command went to its key\'s node');
      });

      if (lib.kind === 'ioredis') {
        test('with auto-pipelining too (it batches by the keys ioredis knows)', async (t) => {
          const piped = await lib.connectCluster(cluster.ports, { enableAutoPipelining: true, keyPrefix: 'ap:' });
          const pl = new Limiter(piped);
          t.after(async () => {
            await pl.close();
            await lib.close(piped);
          });
          const keys = ['{a}p', '{b}p', '{c}p', '{a}q', '{b}q', '{c}q'];
          const rs = await Promise.all(keys.flatMap((k) => [1, 2].map(() => pl.bucket(k, FROZEN, 5).consume())));
          assert.deepEqual(rs.map((r) => r.remaining).sort(), Array(6).fill(3).concat(Array(6).fill(4)).sort());
          for (const k of keys) assert.equal(await (await cluster.adminFor(`ap:${k}`)).exists(`ap:${k}`), 1, k);
          assert.equal(await cluster.redirections(), 0);
        });
      }

      test('keys in different slots: CROSSSLOT, nothing changes', async () => {
        const parts = [[limiter.bucket(KEYS[0], FROZEN, 5), 1], [limiter.bucket(KEYS[1], FROZEN, 5), 1]];
        await assert.rejects(limiter.consumeMany(parts), (e) => e instanceof CommandError && /^CROSSSLOT/.test(e.message));
        for (const key of KEYS) assert.equal(await (await cluster.adminFor(key)).exists(key), 0);
      });

      test('acquire, waiting on a timer and blocking on a duplicated cluster client', async () => {
        for (const block of [false, true]) {
          const b = limiter.bucket(`{c}:acq${block}`, 4, 1);
          await b.consume();
          const start = performance.now();
          const r = await b.acquire(1, { block, timeoutMs: 1000 });
          const waited = performance.now() - start;
          assert.ok(r.allowed && waited > 150 && waited < 900, `block ${block}: ${waited}`);
        }
      });

      test("calls with a flow wait in the queue on the key's node (ignored on the fallback)", async () => {
        // A grant every 250 ms: the four calls wait up to a second.
        const b = limiter.bucket('{b}:shared', 4, 1);
        await b.consume();
        const calls = ['A', 'B', 'A', 'B'].map((flow) => b.acquire(1, { flow, timeoutMs: 5000 }));
        if (backend === 'module') {
          const seen = new Set();
          const end = Date.now() + 2000;
          while (seen.size < 2 && Date.now() < end) for (const f of (await b.info())?.flows ?? []) seen.add(f.name);
          assert.deepEqual([...seen].sort(), ['A', 'B'], 'both flows wait on the node');
        }
        for (const r of await Promise.all(calls)) assert.ok(r.allowed);
        assert.equal(await cluster.redirections(), 0);
      });
    });
  }
}
