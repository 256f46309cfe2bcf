// Waits never exceed what the server accepts (tb.max-wait-ms): the limiter
// learns the setting from the server's `ERR wait exceeds tb.max-wait-ms (N)`
// and retries once; longer waits asked for are capped to it, and an acquire
// timeout longer than it waits, holding nothing, until the tokens are
// within reach. The first tests script the server's replies (a stand-in
// client) so that every command the limiter sends is checked; the last run
// against real servers: the production setting of docs/operations/configuration.md (tb.max-wait-ms
// 10000) on the module, and the Lua fallback's fixed 60000.

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import Redis from 'ioredis';
import { CommandError, DEFAULT_MAX_WAIT_MS, Limiter, RateLimited } from 'tb-limiter';

import { LIBRARIES } from './helpers/clients.js';
import { Server } from './helpers/server.js';

/** The class name node-redis gives server errors. */
class ErrorReply extends Error {}

/**
 * A stand-in node-redis client for a server whose tb.max-wait-ms is `max`
 * (null: an older server whose error does not say N). `replies` answers
 * each accepted RESERVE in turn. `sent` records every command.
 */
function server(max, replies = []) {
  const sent = [];
  const client = {
    sent,
    async sendCommand(args) {
      sent.push(args.join(' '));
      const i = args.indexOf('RESERVE');
      const w = i > 0 ? Number(args[i + 1]) : 0;
      const limit = max ?? 10_000;
      if (w > limit) throw new ErrorReply(`ERR wait exceeds tb.max-wait-ms${max === null ? '' : ` (${max})`}`);
      const next = replies.shift();
      if (!next) throw new Error(`unexpected command ${args.join(' ')}`);
      return next;
    },
    duplicate() {
      throw new Error('not used');
    },
  };
  return client;
}

describe('tb.max-wait-ms', () => {
  test('the default wait is learned from the refusal, then used directly', async () => {
    const c = server(10_000, [[1, 0, 2000, 2000, 1], [1, 0, 4000, 4000, 1]]);
    const limiter = new Limiter(c);
    assert.equal(limiter.maxWaitMs, DEFAULT_MAX_WAIT_MS);
    const b = limiter.bucket('k', '0.5', 1);
    const r = await b.reserve();
    assert.deepEqual([r.allowed, r.retryAfterMs], [true, 2000]);
    assert.equal(limiter.maxWaitMs, 10_000);
    await b.reserve();
    assert.deepEqual(c.sent, [
      'TB.CONSUME k 0.5 1 1 RESERVE 60000',
      'TB.CONSUME k 0.5 1 1 RESERVE 10000',
      'TB.CONSUME k 0.5 1 1 RESERVE 10000',
    ]);
  });

  test('a longer wait asked for is capped; a shorter one is sent as is', async () => {
    const c = server(10_000, [[0, 0, 30_000, 30_000, 0], [1, 0, 0, 2000, 1]]);
    const limiter = new Limiter(c, { maxWaitMs: 10_000 });
    const denied = await limiter.bucket('k', '0.5', 1).reserve(1, { maxWaitMs: 45_000 });
    assert.deepEqual([denied.allowed, denied.retryAfterMs], [false, 30_000], 'a denial, saying when');
    await limiter.bucket('k', '0.5', 1).reserve(1, { maxWaitMs: 1234.9 });
    assert.deepEqual(c.sent, ['TB.CONSUME k 0.5 1 1 RESERVE 10000', 'TB.CONSUME k 0.5 1 1 RESERVE 1234']);
  });

  test('consumeMany and acquireMany learn it too', async () => {
    const c = server(100, [[1, 40, 1, 1]]);
    const limiter = new Limiter(c);
    const parts = [[limiter.bucket('{t}a', 10, 1), 1], [limiter.bucket('{t}b', 10, 1), 1]];
    const before = Date.now();
    const r = await limiter.acquireMany(parts);
    const elapsed = Date.now() - before;
    assert.deepEqual([r.allowed, r.retryAfterMs], [true, 40]);
    assert.equal(c.sent.length, 2, c.sent.join('\n'));
    // The default timeout, less the milliseconds gone since the call began.
    const first = /^TB\.MCONSUME 2 \{t\}a \{t\}b 10 1 1 10 1 1 RESERVE (\d+)$/.exec(c.sent[0]);
    assert.ok(first, c.sent[0]);
    const w = Number(first[1]);
    assert.ok(w <= DEFAULT_MAX_WAIT_MS && w >= DEFAULT_MAX_WAIT_MS - elapsed, `RESERVE ${w} after ${elapsed} ms`);
    assert.equal(c.sent[1], 'TB.MCONSUME 2 {t}a {t}b 10 1 1 10 1 1 RESERVE 100');
  });

  test('an acquire timeout beyond it waits, holding nothing, until the tokens are within reach', async () => {
    // The server reserves at most 100 ms ahead; the token is 250 ms away.
    const c = server(100, [[0, 0, 250, 250, 0], [1, 0, 100, 100, 1]]);
    const limiter = new Limiter(c, { maxWaitMs: 100 });
    const start = performance.now();
    const r = await limiter.bucket('k', 4, 1).acquire(1, { timeoutMs: 400 });
    const waited = performance.now() - start;
    assert.deepEqual([r.allowed, r.retryAfterMs], [true, 100]);
    assert.deepEqual(c.sent, ['TB.CONSUME k 4 1 1 RESERVE 100', 'TB.CONSUME k 4 1 1 RESERVE 100']);
    // 150 ms holding nothing (250 - 100), then the 100 ms reserved.
    assert.ok(waited >= 249 && waited < 600, `${waited}`);
  });

  test('a wait beyond the timeout is RateLimited at once', async () => {
    const c = server(100, [[0, 0, 500, 500, 0]]);
    const limiter = new Limiter(c, { maxWaitMs: 100 });
    const start = performance.now();
    await assert.rejects(limiter.bucket('k', 4, 1).acquire(1, { timeoutMs: 400 }), RateLimited);
    assert.ok(performance.now() - start < 100);
    assert.deepEqual(c.sent, ['TB.CONSUME k 4 1 1 RESERVE 100']);
  });

  test('an older server that does not say N: the error as it is', async () => {
    const c = server(null);
    const limiter = new Limiter(c);
    await assert.rejects(limiter.bucket('k', 1, 1).reserve(), (e) => e instanceof CommandError && /max-wait-ms$/.test(e.message));
    assert.equal(limiter.maxWaitMs, DEFAULT_MAX_WAIT_MS);
  });
});

describe('tb.max-wait-ms on real servers', () => {
  const servers = {};
  before(async () => {
    servers.module = await Server.start({ module: true, args: ['--tb.max-wait-ms', '10000'] });
    servers.lua = await Server.start({ module: false });
  });
  after(async () => {
    for (const s of Object.values(servers)) await s.stop();
  });

  for (const lib of LIBRARIES) {
    for (const [backend, max] of [['module', 10_000], ['lua', 60_000]]) {
      test(`${lib.name}, ${backend}: the default waits fit the server's setting (${max} ms)`, async (t) => {
        const admin = new Redis(servers[backend].port, '127.0.0.1');
        await admin.flushall();
        admin.disconnect();
        const client = await lib.connect(servers[backend].port);
        const limiter = new Limiter(client);
        t.after(async () => {
          await limiter.close();
          await lib.close(client);
        });
        // 4 tokens/s, burst 1: after the first, each call waits its turn.
        const b = limiter.bucket('mw', 4, 1);
        assert.equal((await b.consume()).allowed, true);
        const r = await b.reserve(1, { maxWaitMs: 120_000 }); // asked for more than the server allows
        assert.deepEqual([r.allowed, r.retryAfterMs > 200], [true, true]);
        assert.equal(limiter.maxWaitMs, max, 'learned from the refusal of 120000');
        assert.equal((await b.reserve()).allowed, true);
        assert.equal(await b.refund(2), 0, 'both turns given back');
        const ab = [[limiter.bucket('{m}a', 4, 1), 1], [limiter.bucket('{m}b', 4, 1), 1]];
        assert.equal((await limiter.acquireMany(ab)).allowed, true);
        const waited = performance.now();
        assert.equal((await limiter.acquireMany(ab, { timeoutMs: 5000 })).allowed, true);
        assert.ok(performance.now() - waited > 200);
        // A fresh limiter's first wait is the server's BLOCK (module) with
        // the default, refused and learned.
        const fresh = new Limiter(client);
        const blocked = await fresh.bucket('mw', 4, 1).acquire(1, { block: true });
        assert.equal(blocked.allowed, true);
        assert.equal(fresh.maxWaitMs, max);
        await fresh.close();
      });
    }
  }
});
