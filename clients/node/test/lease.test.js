// Leases when the call fails (issue 18 item 1): a body that throws may have
// reached the provider (a client-side timeout while the provider still
// works and bills), so an estimate stays charged and an in-flight slot stays
// held until its TTL; only a failure known to happen before the request
// left (NotSentError, `returnOn`, `lease.giveBack()`) gives everything back.
// Then the scenario of the issue: a fake API (a local HTTP server) that
// takes 1 s, called with a timeout of 0.5 s, behind TPM 6000/m (capacity
// 2000) and 4 in flight: the API never sees more tokens in any window than
// the bucket allows, nor more than 4 calls at once.

import assert from 'node:assert/strict';
import http from 'node:http';
import { performance } from 'node:perf_hooks';
import { after, before, describe, test } from 'node:test';

import { createClient } from 'redis';
import { Limiter, NotSentError } from 'tb-limiter';

import { BACKENDS } from './helpers/fixtures.js';
import { Server } from './helpers/server.js';

const FROZEN = '1e-9'; // refills nothing a test could see

for (const backend of BACKENDS) {
  describe(`lease failure rules (${backend})`, () => {
    let server;
    let client;
    let limiter;
    before(async () => {
      server = await Server.start({ module: backend === 'module' });
      client = createClient({ url: `redis://127.0.0.1:${server.port}` });
      await client.connect();
      limiter = new Limiter(client, { backend });
    });
    after(async () => {
      await limiter?.close();
      await client?.quit();
      await server?.stop();
    });

    const boom = async () => {
      throw new Error('timed out: the provider may still be working');
    };

    test('a slot stays held when the body throws, comes back on NotSentError, returnOn, giveBack', async () => {
      const slot = limiter.bucket('inflight', 0, 1);
      await assert.rejects(slot.withLease(1, { ttlMs: 60_000 }, boom), /timed out/);
      assert.equal((await slot.peek()).allowed, false, 'the slot is held: the call may still be running');
      assert.equal((await slot.info()).tokens, 0);

      const other = limiter.bucket('inflight2', 0, 1);
      const refused = Object.assign(new Error('connect ECONNREFUSED'), { code: 'ECONNREFUSED' });
      await assert.rejects(
        other.withLease(1, { ttlMs: 60_000 }, async () => {
          throw new NotSentError('never sent', { cause: refused });
        }),
        NotSentError,
      );
      assert.equal((await other.peek()).allowed, true, 'NotSentError gives the slot back');
      await assert.rejects(
        other.withLease(1, { ttlMs: 60_000, returnOn: (e) => e.code === 'ECONNREFUSED' }, async () => {
          throw refused;
        }),
        /ECONNREFUSED/,
      );
      assert.equal((await other.peek()).allowed, true, 'an error returnOn accepts gives the slot back');
      await assert.rejects(
        other.withLease(1, { ttlMs: 60_000 }, async () => {
          throw new Error('wrapped', { cause: new NotSentError() });
        }),
        /wrapped/,
      );
      assert.equal((await other.peek()).allowed, true, 'a NotSentError as the cause counts');
      const seen = await other.withLease(1, { ttlMs: 60_000 }, async (lease) => {
        await lease.giveBack();
        return (await other.peek()).allowed;
      });
      assert.equal(seen, true, 'giveBack returns the slot at once');
      assert.equal((await other.peek()).allowed, true);
    });

    test('cancelled while waiting for the lease: nothing held, the body never runs', async () => {
      const rpm = limiter.bucket('{c}:rpm', FROZEN, 10);
      const slot = limiter.bucket('{c}:inflight', 0, 1);
      const first = await slot.lease(1, { ttlMs: 60_000 });
      let ran = false;
      await assert.rejects(
        limiter.withLeases([[rpm, 1], [slot, 1, 'slot']], { ttlMs: 60_000, signal: AbortSignal.timeout(100) }, async () => {
          ran = true;
        }),
        (e) => e.name === 'TimeoutError',
      );
      assert.equal(ran, false);
      assert.equal(await slot.release(first.leaseId), 1);
      assert.equal((await rpm.info())?.tokens ?? 10, 10, 'nothing taken from RPM');
    });

    test('an estimate stays charged when the body throws, is settled to what was used otherwise', async () => {
      const tpm = limiter.bucket('tpm', FROZEN, 1000);
      await assert.rejects(tpm.withLease(300, { ttlMs: 60_000, keep: true }, boom), /timed out/);
      const after1 = await tpm.info();
      assert.equal(Math.round(after1.tokens), 700, 'the estimate stays charged');
      assert.equal(await tpm.withLease(300, { ttlMs: 60_000, keep: true }, (lease) => {
        lease.used = 120;
        return 'ok';
      }), 'ok');
      assert.equal(Math.round((await tpm.info()).tokens), 580, 'settled to the 120 used');
    });

    test('withLeases: RPM taken, a TPM estimate and a slot lent, by how the body ended', async () => {
      const rpm = limiter.bucket('{t}:rpm', FROZEN, 100);
      const tpm = limiter.bucket('{t}:tpm', FROZEN, 10_000);
      const slots = limiter.bucket('{t}:inflight', 0, 4);
      const parts = [[rpm, 1], [tpm, 2000, 'estimate'], [slots, 1, 'slot']];
      const levels = async () => [rpm, tpm, slots].map(async (b) => Math.round((await b.info())?.tokens ?? b.capacity));
      const now = async () => Promise.all(await levels());

      // Returned: the slot released, the estimate settled to the use reported.
      const ids = await limiter.withLeases(parts, { ttlMs: 60_000 }, async (lease) => {
        assert.deepEqual(await now(), [99, 8000, 3]);
        lease.used = 2600;
        return lease.leaseIds;
      });
      assert.equal(ids[0], 0, 'the RPM part is taken, not lent');
      assert.ok(ids[1] > 0 && ids[2] > 0);
      assert.deepEqual(await now(), [99, 7400, 4]);

      // Threw: the estimate kept in full, the slot held.
      await assert.rejects(limiter.withLeases(parts, { ttlMs: 60_000 }, boom), /timed out/);
      assert.deepEqual(await now(), [98, 5400, 3]);

      // Not sent: everything back, the request taken from RPM too.
      await assert.rejects(
        limiter.withLeases(parts, { ttlMs: 60_000 }, async () => {
          throw new NotSentError();
        }),
        NotSentError,
      );
      assert.deepEqual(await now(), [98, 5400, 3]);

      // Nothing given back twice: giveBack, then a throw.
      await assert.rejects(
        limiter.withLeases(parts, { ttlMs: 60_000 }, async (lease) => {
          await lease.giveBack();
          throw new Error('after giving back');
        }),
        /after giving back/,
      );
      assert.deepEqual(await now(), [98, 5400, 3]);
    });
  });
}

/** A stand-in LLM API: takes `ms` per call whatever the client does; records arrivals. */
function fakeApi(ms) {
  const calls = [];
  let inFlight = 0;
  let maxInFlight = 0;
  const srv = http.createServer((req, res) => {
    const tokens = Number(req.headers['x-tokens']);
    const granted = Number(req.headers['x-granted']);
    calls.push({ at: performance.now(), tokens, granted });
    inFlight += 1;
    maxInFlight = Math.max(maxInFlight, inFlight);
    setTimeout(() => {
      inFlight -= 1;
      res.end(JSON.stringify({ usage: tokens }));
    }, ms);
  });
  return {
    calls,
    get maxInFlight() {
      return maxInFlight;
    },
    get inFlight() {
      return inFlight;
    },
    listen: () => new Promise((resolve) => srv.listen(0, '127.0.0.1', () => resolve(srv.address().port))),
    close: () => new Promise((resolve) => srv.close(resolve)),
  };
}

/**
 * `workers` loops calling the API through `withLeases` for `durationMs`; the
 * API takes 1 s, the client gives up after 0.5 s. Returns the API's record.
 */
async function scenario(limiter, { durationMs, returnOn }) {
  const api = fakeApi(1000);
  const port = await api.listen();
  const tpm = limiter.bucket(`{llm}:tpm:${returnOn ? 'b' : 'a'}`, '6000/m', 2000);
  const slots = limiter.bucket(`{llm}:inflight:${returnOn ? 'b' : 'a'}`, 0, 4);
  const estimate = 500;
  const stopAt = performance.now() + durationMs;
  const outcomes = { ok: 0, timeout: 0, denied: 0 };
  // A grant happens on the server between sending TB.MCONSUME and its
  // reply: the longest such round trip bounds how much earlier than the
  // body's clock reading (x-granted) the bucket counted it.
  const client = limiter.client;
  const send = client.sendCommand;
  let rtt = 0;
  client.sendCommand = function (args, ...rest) {
    const t = performance.now();
    return send.call(this, args, ...rest).then((reply) => {
      if (args[0] === 'TB.MCONSUME') rtt = Math.max(rtt, performance.now() - t);
      return reply;
    });
  };
  const worker = async () => {
    while (performance.now() < stopAt) {
      try {
        await limiter.withLeases(
          [[tpm, estimate, 'estimate'], [slots, 1, 'slot']],
          { ttlMs: 2000, timeoutMs: Math.max(1, stopAt - performance.now()), returnOn },
          async (lease) => {
            const res = await fetch(`http://127.0.0.1:${port}/v1/chat`, {
              headers: { 'x-tokens': String(estimate), 'x-granted': String(performance.now()) },
              signal: AbortSignal.timeout(500),
            });
            lease.used = (await res.json()).usage;
          },
        );
        outcomes.ok += 1;
      } catch (e) {
        if (e.name === 'RateLimited') outcomes.denied += 1;
        else if (e.name === 'TimeoutError') outcomes.timeout += 1;
        else throw e;
      }
    }
  };
  try {
    await Promise.all(Array.from({ length: 8 }, worker));
  } finally {
    client.sendCommand = send;
  }
  while (api.inFlight > 0) await new Promise((r) => setTimeout(r, 50));
  await api.close();
  return { calls: api.calls, maxInFlight: api.maxInFlight, outcomes, rtt };
}

/**
 * The largest excess, over every window of arrivals, of the tokens the API
 * saw above `capacity + rate * (window + delay)`, where `delay` is the
 * longest time from a grant to the API seeing the call (the bucket counts
 * from grants; the API sees the calls a little later): from the body's
 * clock reading to the API, plus the longest round trip of the grant.
 */
function worstExcess(calls, capacity, ratePerS, rtt) {
  const xs = [...calls].sort((a, b) => a.at - b.at);
  const delay = rtt + Math.max(0, ...xs.map((c) => c.at - c.granted));
  let worst = -Infinity;
  for (let i = 0; i < xs.length; i++) {
    let sum = 0;
    for (let j = i; j < xs.length; j++) {
      sum += xs[j].tokens;
      const bound = capacity + (ratePerS * (xs[j].at - xs[i].at + delay)) / 1000;
      worst = Math.max(worst, sum - bound);
    }
  }
  return { worst, delay };
}

describe('a client timeout shorter than the API (TPM 6000/m, capacity 2000, 4 in flight)', () => {
  let server;
  let client;
  let limiter;
  before(async () => {
    server = await Server.start({ module: true });
    client = createClient({ url: `redis://127.0.0.1:${server.port}` });
    await client.connect();
    limiter = new Limiter(client);
  });
  after(async () => {
    await limiter?.close();
    await client?.quit();
    await server?.stop();
  });

  test('the API never sees more tokens than the bound in any window, nor more than 4 in flight', async () => {
    const r = await scenario(limiter, { durationMs: 6000 });
    const { worst, delay } = worstExcess(r.calls, 2000, 100, r.rtt);
    const tokens = r.calls.reduce((a, c) => a + c.tokens, 0);
    console.log(
      `kept on failure: ${r.calls.length} calls, ${tokens} tokens seen by the API in 6 s, ` +
        `max ${r.maxInFlight} in flight, worst window ${worst.toFixed(0)} tokens over the bound ` +
        `(grant-to-API delay ${delay.toFixed(1)} ms); outcomes ${JSON.stringify(r.outcomes)}`,
    );
    assert.ok(r.outcomes.timeout > 0, 'the client timed out (the scenario happened)');
    assert.ok(tokens >= 2000, `the burst was used (${tokens} tokens)`);
    assert.ok(worst <= 0, `a window saw ${worst} tokens over capacity + rate * window`);
    assert.ok(r.maxInFlight <= 4, `${r.maxInFlight} calls in flight at the API`);
  });

  test('giving everything back on a timeout (what a failure used to do) breaks both bounds', async () => {
    const r = await scenario(limiter, { durationMs: 3000, returnOn: (e) => e.name === 'TimeoutError' });
    const { worst } = worstExcess(r.calls, 2000, 100, r.rtt);
    const tokens = r.calls.reduce((a, c) => a + c.tokens, 0);
    console.log(
      `given back on failure: ${r.calls.length} calls, ${tokens} tokens seen by the API in 3 s, ` +
        `max ${r.maxInFlight} in flight, worst window ${worst.toFixed(0)} tokens over the bound`,
    );
    assert.ok(worst > 0 && r.maxInFlight > 4, 'the scenario tells the two rules apart');
  });
});
