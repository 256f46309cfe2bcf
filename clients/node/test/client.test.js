// The client on both backends (the module, and the Lua fallback on a server
// without it), through every supported library: node-redis 6 and 4,
// ioredis 6 and 5.

import assert from 'node:assert/strict';
import { beforeEach, describe, test } from 'node:test';

import { BucketInfo, CommandError, Limiter, MultiResult, RateLimited, Result } from 'tb-limiter';

import { LIBRARIES } from './helpers/clients.js';
import { BACKENDS, info, limiterCalls, servers } from './helpers/fixtures.js';

// 1e-12 tokens/s: one nano-token takes 1000 s, so nothing refills during a
// test and the replies do not depend on timing.
const FROZEN = '1e-12';

const env = servers();

for (const lib of LIBRARIES) {
  for (const backend of BACKENDS) {
    describe(`${lib.name}, ${backend}`, () => {
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

      test('the backend is detected from the first command', async () => {
        assert.equal(limiter.backend, null);
        await limiter.bucket('d', 1, 1).peek();
        assert.equal(limiter.backend, backend);
      });

      test('a fresh bucket counts down', async () => {
        const b = limiter.bucket('user:42', 10, 5);
        const r = await b.consume();
        assert.deepEqual(r, new Result(true, 4, 0, 100, 1));
        assert.deepEqual([r.retryAfter, r.never], [0, false]);
        assert.deepEqual(r.reply, [1, 4, 0, 100, 1]);
        assert.equal((await b.consume(4)).granted, 4);
        const denied = await b.consume();
        assert.deepEqual([denied.allowed, denied.granted, denied.remaining], [false, 0, 0]);
        assert.ok(denied.retryAfterMs > 0 && denied.retryAfterMs <= 100, `${denied.retryAfterMs}`);
      });

      test('leases: held, released once, settled, and held when the work throws', async () => {
        const inflight = limiter.bucket('inflight', 0, 1);
        const r = await inflight.lease(1, { ttlMs: 60_000 });
        assert.ok(r.allowed && r.leaseId > 0, `${r.reply}`);
        assert.equal(r.reply.length, 6);
        const full = await inflight.consume();
        assert.ok(!full.allowed && full.retryAfterMs > 59_000, 'the wait for the lease to expire');
        await assert.rejects(inflight.lease(1, { ttlMs: 100, timeoutMs: 30 }), RateLimited);
        assert.equal(await inflight.release(r.leaseId), 1);
        assert.equal(await inflight.release(r.leaseId), null, 'a second release gives nothing back');
        await assert.rejects(
          inflight.withLease(1, { ttlMs: 60_000 }, async () => {
            throw new Error('boom');
          }),
          /boom/,
        );
        assert.ok(!(await inflight.peek()).allowed, 'held when the work threw: the call may still be running');
        const tpm = limiter.bucket('tpm', FROZEN, 1000);
        const out = await tpm.withLease(400, { ttlMs: 60_000 }, async () => ({ used: 900 }));
        assert.deepEqual(out, { used: 900 });
        const i = await tpm.info();
        assert.equal(String(i.tokens), '100', 'the overrun of 500 charged');
        const est = await tpm.lease(50, { ttlMs: 60_000 });
        assert.equal(await tpm.settle(est.leaseId, 10), 40);
        assert.equal(await tpm.settle(est.leaseId, 10), null, 'a settle applies once');
      });

      test('atmost with a chunk grants a chunk or nothing, alone and shared', async () => {
        const b = limiter.bucket('bw', FROZEN, 100);
        assert.equal((await b.consume(70)).granted, 70);
        const short = await b.consume(50, { atmost: true, chunk: 40 });
        assert.deepEqual([short.allowed, short.granted, short.remaining], [false, 0, 30]);
        assert.equal((await b.consume(50, { atmost: true, chunk: 20 })).granted, 30);
        await assert.rejects(b.consume(5, { chunk: 2 }), RangeError);
        const user = limiter.bucket('{u}:bw', FROZEN, 1000);
        const global = limiter.bucket('{u}:global', FROZEN, 300);
        const reqs = limiter.bucket('{u}:req', FROZEN, 10);
        const m = await limiter.consumeMany([[user, 500], [global, 500], [reqs, 1]], { atmost: true, chunk: 64 });
        assert.deepEqual(m, new MultiResult(true, 0, [700, 0, 9], 300));
        assert.deepEqual(m.reply, [1, 0, 700, 0, 9, 300]);
        const none = await limiter.consumeMany([[user, 500], [global, 500]], { atmost: true });
        assert.deepEqual([none.allowed, none.granted], [false, 0]);
        assert.ok(none.retryAfterMs > 1e9, 'the wait for one token at 1e-12 a second');
        await assert.rejects(limiter.consumeMany([[user, 5]], { atmost: true, maxWaitMs: 10 }), RangeError);
      });

      test('denials and peeks write nothing', async () => {
        const b = limiter.bucket('k', FROZEN, 3);
        assert.ok((await b.consume(4)).never);
        assert.ok((await b.peek()).allowed);
        assert.equal(await admin.exists('k'), 0, 'a missing key is a full bucket');
        await b.consume(3);
        const before = await b.info();
        assert.equal((await b.consume(1)).allowed, false);
        const after = await b.info();
        // The stored state is the same; the times until expiry and until
        // full count down from now.
        const state = (i) => ({ ...i, ttlMs: 0, resetAfterMs: 0 });
        assert.deepEqual(state(after), state(before));
        assert.ok(after.resetAfterMs <= before.resetAfterMs && after.resetAfterMs >= before.resetAfterMs - 1000);
      });

      test('requests that can never succeed', async () => {
        const over = await limiter.bucket('a', 1, 5).consume(6);
        assert.deepEqual([over.allowed, over.retryAfterMs, over.retryAfter, over.never], [false, -1, Infinity, true]);
        const budget = limiter.bucket('b', 0, 2);
        assert.equal((await budget.consume(2)).resetAfterMs, -1);
        assert.deepEqual(await budget.consume(1), new Result(false, 0, -1, -1, 0));
        assert.equal(await admin.ttl('b'), -1, 'a fixed budget does not expire');
      });

      test('ATMOST grants what is there', async () => {
        const b = limiter.bucket('bytes', FROZEN, 10);
        await b.consume(7);
        const r = await b.consume(5, { atmost: true });
        assert.deepEqual([r.allowed, r.granted, r.remaining], [true, 3, 0]);
        assert.equal((await b.consume(5, { atmost: true })).allowed, false);
        assert.equal((await limiter.bucket('big', FROZEN, 10).consume(1000, { atmost: true })).granted, 10);
      });

      test('reservations queue first come, first served', async () => {
        const b = limiter.bucket('llm', 10, 1);
        assert.equal((await b.reserve(1, { maxWaitMs: 1000 })).retryAfterMs, 0);
        const t0 = performance.now();
        const first = await b.reserve(1, { maxWaitMs: 1000 });
        const second = await b.reserve(1, { maxWaitMs: 1000 });
        const between = performance.now() - t0;
        assert.ok(first.allowed && second.allowed);
        assert.ok(first.retryAfterMs > 0 && first.retryAfterMs <= 100 && second.retryAfterMs <= 200);
        // One token (100 ms) later, less the server time between the two
        // calls (at most the client's, plus a tick of the ms clock).
        const gap = second.retryAfterMs - first.retryAfterMs;
        assert.ok(gap >= 100 - between - 1 && gap <= 100, `${gap} (${between} ms between the calls)`);
        const i = await b.info();
        assert.ok(i.tokens < 0 && i.tokensExact.startsWith('-'));
        const late = await b.reserve(1, { maxWaitMs: 150 });
        assert.deepEqual([late.allowed, late.granted], [false, 0]);
        assert.ok(late.retryAfterMs > 150, 'a denied reservation carries a wait too: check allowed');
      });

      test('refund gives tokens back, never above capacity', async () => {
        const b = limiter.bucket('tpm', FROZEN, 1000);
        assert.equal(await b.refund(5), null, 'missing key: already full');
        await b.consume(800);
        assert.equal(await b.refund(300), 500);
        assert.equal(await b.refund(10_000), 1000);
      });

      test('info has numbers, and the exact decimals', async () => {
        assert.equal(await limiter.bucket('none', 1, 1).info(), null);
        const b = limiter.bucket('i', '100/m', 7);
        await b.consume(2);
        const i = await b.info();
        assert.ok(i instanceof BucketInfo);
        assert.equal(i.capacity, 7);
        assert.equal(i.rateExact, '1.666666666667');
        assert.equal(i.rate, 1.666666666667);
        assert.ok(i.tokens >= 5 && i.tokens < 5.1, `${i.tokens}`);
        assert.equal(Number(i.tokensExact), i.tokens);
        for (const k of ['updatedAtMs', 'resetAfterMs', 'ttlMs']) assert.equal(typeof i[k], 'number', k);
        const now = Number((await admin.time())[0]) * 1000;
        assert.ok(Math.abs(i.updatedAtMs - now) < 5000);
        assert.ok(i.resetAfterMs > 0 && i.ttlMs > 0 && i.ttlMs <= i.resetAfterMs + 1);
      });

      test('rates in every spelling', async () => {
        for (const [rate, shown] of [
          [0.5, '0.5'],
          ['100/m', '1.666666666667'],
          ['1e-3', '0.001'],
          [1e-7, '0.0000001'],
          [10, '10'],
        ]) {
          const b = limiter.bucket(`r${shown}`, rate, 5);
          await b.consume();
          assert.equal((await b.info()).rateExact, shown);
        }
      });

      test('consumeMany is all or nothing', async () => {
        const rpm = limiter.bucket('{acme}:rpm', FROZEN, 3);
        const tpm = limiter.bucket('{acme}:tpm', FROZEN, 1000);
        assert.deepEqual(await limiter.consumeMany([[rpm, 1], [tpm, 600]]), new MultiResult(true, 0, [2, 400]));
        const denied = await limiter.consumeMany([[rpm, 1], [tpm, 600]]);
        assert.equal(denied.allowed, false);
        assert.deepEqual(denied.remaining, [2, 400]);
        assert.ok((await limiter.consumeMany([[rpm, 1], [tpm, 2000]])).never);
      });

      test('acquireMany reserves, then waits once', async () => {
        const a = limiter.bucket('{m}:a', 20, 1);
        const b = limiter.bucket('{m}:b', 10, 1);
        await limiter.acquireMany([[a, 1], [b, 1]]);
        const calls = await limiterCalls(admin);
        const start = performance.now();
        const r = await limiter.acquireMany([[a, 1], [b, 1]], { timeoutMs: 1000 });
        const waited = performance.now() - start;
        assert.ok(r.allowed && r.retryAfterMs > 0 && r.retryAfterMs <= 100, `${r.retryAfterMs}`);
        assert.ok(waited >= r.retryAfterMs - 1 && waited < r.retryAfterMs + 500, `${waited}`);
        assert.equal((await limiterCalls(admin)) - calls, 1, 'one command, then a timer');
      });

      test('errors are the server\'s, and change nothing', async () => {
        await assert.rejects(limiter.bucket('e', '-1', 5).consume(), (e) => {
          assert.ok(e instanceof CommandError);
          assert.equal(e.command, 'TB.CONSUME');
          assert.match(e.message, /^ERR rate must be a non-negative decimal/);
          assert.ok(e.cause instanceof Error);
          return true;
        });
        await assert.rejects(limiter.bucket('e', '1e-13', 5).consume(), /rate out of range/);
        await admin.set('s', 'x');
        await assert.rejects(limiter.bucket('s', 1, 5).consume(), (e) => e instanceof CommandError && /^WRONGTYPE/.test(e.message));
        await assert.rejects(limiter.consumeMany([[limiter.bucket('ok', 1, 5), 1], [limiter.bucket('s', 1, 5), 1]]), /WRONGTYPE/);
        assert.equal(await admin.exists('e', 'ok'), 0);
        assert.equal(await admin.get('s'), 'x');
      });

      test('arguments are checked before anything is sent', async () => {
        const b = limiter.bucket('e', 1, 5);
        await assert.rejects(b.consume(1.5), TypeError);
        await assert.rejects(b.consume(-1), RangeError);
        await assert.rejects(b.consume(2 ** 53 + 2), RangeError);
        await assert.rejects(b.reserve(1, { maxWaitMs: -1 }), RangeError);
        assert.throws(() => limiter.bucket('e', -1, 5), RangeError);
        assert.throws(() => limiter.bucket('e', NaN, 5), RangeError);
        assert.throws(() => limiter.bucket('e', 1, 0.5), TypeError);
        assert.throws(() => limiter.bucket(42, 1, 5), TypeError);
        assert.equal((await b.consume(10n)).never, true, 'bigint amounts are accepted');
      });

      test('Buffer keys are binary-safe', async () => {
        const key = Buffer.from([0x6b, 0xff, 0x00, 0x01]);
        const b = limiter.bucket(key, FROZEN, 2);
        assert.equal((await b.consume()).remaining, 1);
        assert.equal((await b.info()).capacity, 2);
        assert.equal(await admin.exists(key), 1);
      });

      test('acquire waits on a timer, not on the connection', async () => {
        const b = limiter.bucket('w', 4, 1);
        await b.consume();
        const calls = await limiterCalls(admin);
        const start = performance.now();
        const pending = b.acquire(1, { timeoutMs: 1000 });
        // The shared client answers other commands while acquire waits.
        const ping = performance.now();
        await (lib.kind === 'ioredis' ? client.ping() : client.ping());
        const pingMs = performance.now() - ping;
        const r = await pending;
        const waited = performance.now() - start;
        assert.ok(r.allowed && r.granted === 1);
        assert.ok(waited >= r.retryAfterMs - 1 && waited < r.retryAfterMs + 500, `${waited} ${r.retryAfterMs}`);
        assert.ok(r.retryAfterMs > 150, `${r.retryAfterMs}`);
        assert.ok(pingMs < 100 && pingMs < r.retryAfterMs / 2, `PING took ${pingMs} ms during the wait`);
        assert.equal((await limiterCalls(admin)) - calls, 1, 'one command, not a polling loop');
      });

      test('acquire gives up at once past the timeout', async () => {
        const b = limiter.bucket('t', FROZEN, 1);
        await b.consume();
        const start = performance.now();
        await assert.rejects(b.acquire(1, { timeoutMs: 500 }), (e) => {
          assert.ok(e instanceof RateLimited);
          assert.equal(e.result.allowed, false);
          assert.ok(e.retryAfterMs > 500);
          assert.equal(e.key, 't');
          return true;
        });
        assert.ok(performance.now() - start < 300, 'answered at once, not after the timeout');
        await assert.rejects(limiter.bucket('n', 1, 1).acquire(2), (e) => e instanceof RateLimited && e.result.never);
      });

      test('an aborted acquire gives its reservation back', async () => {
        const b = limiter.bucket('abort', 1, 1);
        await b.consume();
        const ac = new AbortController();
        const pending = b.acquire(1, { signal: ac.signal });
        const reserved = await waitFor(async () => (await b.info()).tokens < 0);
        assert.ok(reserved, 'the reservation was taken');
        ac.abort(new Error('client went away'));
        await assert.rejects(pending, /client went away/);
        const after = await b.info();
        assert.ok(after.tokens >= 0 && after.tokens < 0.5, `refunded: ${after.tokensExact}`);
        // An aborted signal takes nothing at all.
        await assert.rejects(b.acquire(1, { signal: AbortSignal.abort() }), { name: 'AbortError' });
        assert.ok((await b.info()).tokens >= 0);
      });

      test('acquire with block lets the server hold the reply on its own connection', async () => {
        const b = limiter.bucket('blk', 4, 1);
        await b.consume();
        const blockedBefore = backend === 'module' ? Number((await info(admin, 'tb')).tb_blocked_total) : 0;
        const start = performance.now();
        const pending = b.acquire(1, { block: true, timeoutMs: 1000 });
        const ping = performance.now();
        await client.ping();
        const pingMs = performance.now() - ping;
        const r = await pending;
        const waited = performance.now() - start;
        assert.ok(r.allowed);
        assert.ok(waited > 150 && waited < 900, `${waited}`);
        assert.ok(pingMs < 100, `PING took ${pingMs} ms during the wait`);
        if (backend === 'module') {
          assert.equal(Number((await info(admin, 'tb')).tb_blocked_total), blockedBefore + 1, 'the server held it');
          assert.equal(r.retryAfterMs, 0);
          const clients = Number((await info(admin, 'clients')).connected_clients);
          await limiter.close();
          const closed = await waitFor(async () => Number((await info(admin, 'clients')).connected_clients) === clients - 1);
          assert.ok(closed, 'close() closes the dedicated connection');
        } else {
          assert.ok(r.retryAfterMs > 0, 'the script reserved; the client waited');
        }
      });

      test('an aborted blocking acquire gives its tokens back when the server replies', async () => {
        const b = limiter.bucket('blk-abort', 4, 1);
        await b.consume();
        const ac = new AbortController();
        const pending = b.acquire(1, { block: true, signal: ac.signal });
        assert.ok(await waitFor(async () => (await b.info()).tokens < 0), 'reserved');
        ac.abort();
        await assert.rejects(pending, { name: 'AbortError' });
        // The tokens come back when the (delayed) reply arrives: at the due
        // time for BLOCK, at once for the timer mode.
        assert.ok(await waitFor(async () => ((await b.info())?.tokens ?? 1) > 0.9, 2000), 'refunded');
      });

      test('the backend can be forced', async () => {
        const lua = new Limiter(client, { backend: 'lua' });
        assert.equal(lua.backend, 'lua');
        assert.deepEqual((await lua.bucket('f', 1, 2).consume()).reply, [1, 1, 0, 1000, 1]);
        assert.equal(await admin.type('f'), 'hash');
        const mod = new Limiter(client, { backend: 'module' });
        if (backend === 'module') {
          assert.equal((await mod.bucket('g', 1, 2).consume()).remaining, 1);
        } else {
          await assert.rejects(mod.bucket('g', 1, 2).consume(), (e) => e instanceof CommandError && /unknown command/i.test(e.message));
        }
        assert.throws(() => new Limiter(client, { backend: 'nope' }), RangeError);
        assert.throws(() => new Limiter({}), TypeError);
      });

      test('NOSCRIPT: the script is loaded again after SCRIPT FLUSH', async () => {
        const lua = new Limiter(client, { backend: 'lua' });
        const b = lua.bucket('sf', FROZEN, 5);
        assert.equal((await b.consume()).remaining, 4);
        await admin.script('FLUSH');
        assert.equal((await b.consume()).remaining, 3);
      });
    });
  }
}

/** Polls `check` (a condition on server state) until it holds or `ms` pass. */
async function waitFor(check, ms = 2000) {
  const deadline = Date.now() + ms;
  for (;;) {
    if (await check()) return true;
    if (Date.now() > deadline) return false;
    await new Promise((r) => setTimeout(r, 10));
  }
}
