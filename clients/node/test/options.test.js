// Client options users set that change how commands travel: keyPrefix
// (ioredis, node-redis 6), command and socket timeouts shorter than a wait.

import assert from 'node:assert/strict';
import { beforeEach, describe, test } from 'node:test';

import { Limiter } from 'tb-limiter';

import { LIBRARIES } from './helpers/clients.js';
import { BACKENDS, info, servers } from './helpers/fixtures.js';

const FROZEN = '1e-12';
const env = servers();

/** The option that prefixes keys, for the libraries that have one. */
function prefixOption(lib) {
  if (lib.kind === 'ioredis' || lib.major >= 6) return { keyPrefix: 'app:' };
  return null; // node-redis 4 has no key prefix
}

/**
 * An option that fails a command waiting longer than 300 ms: ioredis'
 * commandTimeout, node-redis 6's socketTimeout (which closes a socket idle
 * that long). node-redis 4 has neither.
 */
function shortTimeout(lib) {
  if (lib.kind === 'ioredis') return { commandTimeout: 300 };
  return lib.major >= 6 ? { socket: { socketTimeout: 300 } } : null;
}

for (const lib of LIBRARIES) {
  for (const backend of BACKENDS) {
    describe(`${lib.name}, ${backend}`, () => {
      let admin;
      beforeEach(async () => {
        admin = env.admin(backend);
        await admin.flushall();
      });

      // node-redis 4 has no keyPrefix.
      if (prefixOption(lib)) test('keyPrefix applies to every command, module or script', async (t) => {
        const client = await lib.connect(env.server(backend).port, prefixOption(lib));
        const limiter = new Limiter(client);
        t.after(async () => {
          await limiter.close();
          await lib.close(client);
        });
        const b = limiter.bucket('k', FROZEN, 5);
        assert.equal((await b.consume(2)).remaining, 3);
        assert.equal(await admin.exists('app:k'), 1);
        assert.equal(await admin.exists('k'), 0);
        assert.equal((await b.info()).capacity, 5);
        assert.equal(await b.refund(1), 4);
        if (lib.kind === 'ioredis') {
          // Auto-pipelining batches commands; the prefix still applies once.
          const piped = await lib.connect(env.server(backend).port, { ...prefixOption(lib), enableAutoPipelining: true });
          const pl = new Limiter(piped);
          const rs = await Promise.all([1, 2, 3].map(() => pl.bucket('k', FROZEN, 5).consume()));
          assert.deepEqual(rs.map((r) => r.remaining).sort(), [1, 2, 3], 'the same bucket as above (4 tokens)');
          await pl.close();
          await lib.close(piped);
          assert.equal(await admin.exists('app:app:k', 'k'), 0);
        }
        const other = limiter.bucket('{t}j', FROZEN, 5);
        const many = await limiter.consumeMany([[limiter.bucket('{t}i', FROZEN, 5), 1], [other, 1]]);
        assert.deepEqual(many.remaining, [4, 4]);
        assert.equal(await admin.exists('app:{t}i', 'app:{t}j'), 2);
      });

      // node-redis 4 has no command or socket timeout.
      if (shortTimeout(lib)) test('a wait longer than the client\'s timeout still works', async (t) => {
        const client = await lib.connect(env.server(backend).port, shortTimeout(lib));
        const limiter = new Limiter(client);
        t.after(async () => {
          await limiter.close();
          await lib.close(client);
        });
        for (const block of [false, true]) {
          const b = limiter.bucket(`t${block}`, 2, 1);
          await b.consume();
          const blockedBefore = backend === 'module' ? Number((await info(admin, 'tb')).tb_blocked_total) : 0;
          const start = performance.now();
          const pending = b.acquire(1, { block, timeoutMs: 2000 });
          // The application keeps using its client meanwhile (an idle one
          // would close under socketTimeout, whatever the limiter does).
          let done = false;
          const keepAlive = (async () => {
            while (!done) {
              await client.ping();
              await new Promise((r) => setTimeout(r, 50));
            }
          })();
          const r = await pending.finally(() => (done = true));
          await keepAlive;
          const waited = performance.now() - start;
          assert.ok(r.allowed && waited > 400, `block ${block}: ${waited}`);
          if (block && backend === 'module') {
            assert.equal(Number((await info(admin, 'tb')).tb_blocked_total), blockedBefore + 1, 'held by the server');
          }
        }
      });
    });
  }
}
