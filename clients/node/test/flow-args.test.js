// Fair share (issue 22), what the client sends: `FLOW name [WEIGHT w]` after
// `BLOCK ms` on every call that waits on the server, a bad flow or weight
// refused with the server's own error before any round trip, the flow left
// out on the Lua fallback, and TB.INFO's `waiting`/`waiting_flows` read.
// (The same error lines from the server: test/agreement.test.js.)
// A recording stand-in for a node-redis client answers; no server needed
// (test/flow.test.js runs the same calls against the module).

import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import { BucketInfo, Limiter } from 'tb-limiter';

/**
 * A node-redis look-alike that records every command (`sent`, each as an
 * array of strings, Buffers kept) and answers `answer(args)`.
 */
function recorder(answer) {
  const sent = [];
  const make = () => ({
    options: {},
    async sendCommand(args) {
      sent.push(args.map((a) => (Buffer.isBuffer(a) ? a : String(a))));
      return answer(args.map(String));
    },
    duplicate: () => make(),
    on() {},
    async connect() {},
    destroy() {},
  });
  return { client: make(), sent };
}

/** A grant as the module answers it for the command in `args`. */
function grant(args) {
  if (args[0] === 'TB.MCONSUME') {
    const parts = Number(args[1]);
    const leases = args.filter((a) => a === 'LEASE').length;
    return [1, 0, ...Array(parts).fill(4), ...Array(leases ? parts : 0).fill(7)];
  }
  if (args[0] === 'EVALSHA') return [1, 4, 0, 0, 1];
  return args.includes('LEASE') ? [1, 4, 0, 0, 1, 7] : [1, 4, 0, 0, 1];
}

/** The arguments after `BLOCK ms` (the wait checked apart), or null without BLOCK. */
function afterBlock(cmd, timeoutMs) {
  const i = cmd.indexOf('BLOCK');
  if (i < 0) return null;
  const w = Number(cmd[i + 1]);
  assert.ok(w <= timeoutMs && w > timeoutMs - 1000, `BLOCK ${w} for a timeout of ${timeoutMs}`);
  return [...cmd.slice(0, i), ...cmd.slice(i + 2)];
}

describe('flow arguments on the module', () => {
  test('acquire sends BLOCK then FLOW, WEIGHT only when not 1', async () => {
    const { client, sent } = recorder(grant);
    const b = new Limiter(client, { backend: 'module' }).bucket('fs:k', '50', 1);
    const r = await b.acquire(1, { timeoutMs: 5000, flow: 'acme' });
    assert.ok(r.allowed);
    await b.acquire(2, { timeoutMs: 5000, flow: 'acme', weight: 1 });
    await b.acquire(1, { timeoutMs: 5000, flow: 'globex', weight: 3 });
    assert.deepEqual(
      sent.map((c) => afterBlock(c, 5000)),
      [
        ['TB.CONSUME', 'fs:k', '50', '1', '1', 'FLOW', 'acme'],
        ['TB.CONSUME', 'fs:k', '50', '1', '2', 'FLOW', 'acme'],
        ['TB.CONSUME', 'fs:k', '50', '1', '1', 'FLOW', 'globex', 'WEIGHT', '3'],
      ],
    );
  });

  test('a Buffer flow goes out as its bytes', async () => {
    const { client, sent } = recorder(grant);
    const name = Buffer.from([0xff, 0x00, 0x41]);
    await new Limiter(client, { backend: 'module' }).bucket('fs:k', '50', 1).acquire(1, { timeoutMs: 5000, flow: name });
    const flow = sent[0][sent[0].indexOf('FLOW') + 1];
    assert.ok(Buffer.isBuffer(flow) && flow.equals(name));
  });

  test('lease and withLease wait in the flow with or without block', async () => {
    const { client, sent } = recorder(grant);
    const b = new Limiter(client, { backend: 'module' }).bucket('fs:slot', 0, 2);
    await b.lease(1, { ttlMs: 1000, timeoutMs: 5000, flow: 'acme', weight: 2 });
    await b.lease(1, { ttlMs: 1000, timeoutMs: 5000, keep: true, block: true, flow: 'acme' });
    await b.withLease(1, { ttlMs: 1000, timeoutMs: 5000, flow: 'b' }, async () => {});
    assert.deepEqual(
      sent.filter((c) => c[0] === 'TB.CONSUME').map((c) => afterBlock(c, 5000)),
      [
        ['TB.CONSUME', 'fs:slot', '0', '2', '1', 'LEASE', '1000', 'FLOW', 'acme', 'WEIGHT', '2'],
        ['TB.CONSUME', 'fs:slot', '0', '2', '1', 'LEASE', '1000', 'KEEP', 'FLOW', 'acme'],
        ['TB.CONSUME', 'fs:slot', '0', '2', '1', 'LEASE', '1000', 'FLOW', 'b'],
      ],
    );
  });

  test('leaseMany, withLeases and acquireMany: TB.MCONSUME ... BLOCK ms FLOW name [WEIGHT w]', async () => {
    const { client, sent } = recorder(grant);
    const limiter = new Limiter(client, { backend: 'module' });
    const rpm = limiter.bucket('{t}:rpm', '600/m', 10);
    const slot = limiter.bucket('{t}:slot', 0, 2);
    await limiter.leaseMany([[rpm, 1], [slot, 1, 'slot']], { ttlMs: 1000, timeoutMs: 5000, flow: 'acme', weight: 5 });
    await limiter.withLeases([[rpm, 1], [slot, 1, 'slot']], { ttlMs: 1000, timeoutMs: 5000, flow: 'b' }, async () => {});
    const m = await limiter.acquireMany([[rpm, 1], [slot, 1]], { timeoutMs: 5000, flow: 'acme' });
    assert.ok(m.allowed);
    assert.deepEqual(
      sent.filter((c) => c[0] === 'TB.MCONSUME').map((c) => afterBlock(c, 5000)),
      [
        ['TB.MCONSUME', '2', '{t}:rpm', '{t}:slot', '600/m', '10', '1', '0', '2', '1', 'LEASE', '2', '1000', 'FLOW', 'acme', 'WEIGHT', '5'],
        ['TB.MCONSUME', '2', '{t}:rpm', '{t}:slot', '600/m', '10', '1', '0', '2', '1', 'LEASE', '2', '1000', 'FLOW', 'b'],
        ['TB.MCONSUME', '2', '{t}:rpm', '{t}:slot', '600/m', '10', '1', '0', '2', '1', 'FLOW', 'acme'],
      ],
    );
  });

  test('without a flow nothing changes: acquire reserves, lease polls', async () => {
    const { client, sent } = recorder(grant);
    const b = new Limiter(client, { backend: 'module' }).bucket('fs:k', '50', 1);
    await b.acquire(1, { timeoutMs: 5000 });
    await b.lease(1, { ttlMs: 1000 });
    assert.deepEqual(sent, [
      ['TB.CONSUME', 'fs:k', '50', '1', '1', 'RESERVE', '5000'],
      ['TB.CONSUME', 'fs:k', '50', '1', '1', 'LEASE', '1000'],
    ]);
  });
});

describe("a bad flow or weight: the server's error line, no round trip", () => {
  const FLOW_ERR = 'ERR FLOW takes a name of 1 to 128 bytes';
  const WEIGHT_ERR = 'ERR WEIGHT takes an integer from 1 to 1000000, after FLOW name';
  const cases = [
    [{ flow: '' }, FLOW_ERR],
    [{ flow: Buffer.alloc(0) }, FLOW_ERR],
    [{ flow: 'x'.repeat(129) }, FLOW_ERR],
    [{ flow: 'é'.repeat(65) }, FLOW_ERR], // 130 bytes in 65 characters
    [{ flow: Buffer.alloc(129) }, FLOW_ERR],
    [{ flow: 'a', weight: 0 }, WEIGHT_ERR],
    [{ flow: 'a', weight: 1_000_001 }, WEIGHT_ERR],
    [{ flow: 'a', weight: 1.5 }, WEIGHT_ERR],
    [{ flow: 'a', weight: NaN }, WEIGHT_ERR],
    [{ flow: 'a', weight: Infinity }, WEIGHT_ERR],
    [{ weight: 2 }, WEIGHT_ERR],
  ];
  const calls = [
    ['acquire', (l, o) => l.bucket('k', 1, 1).acquire(1, o)],
    ['lease', (l, o) => l.bucket('k', 1, 1).lease(1, { ttlMs: 1000, ...o })],
    ['withLease', (l, o) => l.bucket('k', 1, 1).withLease(1, { ttlMs: 1000, ...o }, () => {})],
    ['leaseMany', (l, o) => l.leaseMany([[l.bucket('k', 1, 1), 1, 'slot']], { ttlMs: 1000, ...o })],
    ['withLeases', (l, o) => l.withLeases([[l.bucket('k', 1, 1), 1, 'slot']], { ttlMs: 1000, ...o }, () => {})],
    ['acquireMany', (l, o) => l.acquireMany([[l.bucket('k', 1, 1), 1]], o)],
  ];
  for (const backend of ['module', 'lua', 'auto']) {
    for (const [name, call] of calls) {
      test(`${name}, ${backend}`, async () => {
        const { client, sent } = recorder(grant);
        const limiter = new Limiter(client, { backend });
        for (const [options, message] of cases) {
          await assert.rejects(call(limiter, options), (e) => {
            assert.ok(e instanceof RangeError, `${JSON.stringify(options)}: ${e}`);
            assert.equal(e.message, message);
            return true;
          });
        }
        for (const options of [{ flow: 7 }, { flow: 'a', weight: '2' }, { weight: '1' }]) {
          await assert.rejects(call(limiter, options), TypeError, JSON.stringify(options));
        }
        assert.deepEqual(sent, [], 'nothing sent');
      });
    }
  }

  test('the longest name and the extreme weights are fine', async () => {
    const { client, sent } = recorder(grant);
    const b = new Limiter(client, { backend: 'module' }).bucket('k', 1, 1);
    await b.acquire(1, { timeoutMs: 1000, flow: 'é'.repeat(64), weight: 1_000_000 });
    await b.acquire(1, { timeoutMs: 1000, flow: 'x', weight: 1 });
    await b.acquire(1, { timeoutMs: 1000, weight: 1 }); // the default weight, no flow: reserves
    assert.equal(sent.length, 3);
    assert.ok(sent[2].includes('RESERVE') && !sent[2].includes('WEIGHT'));
    assert.deepEqual(sent[0].slice(-4), ['FLOW', 'é'.repeat(64), 'WEIGHT', '1000000']);
  });
});

describe('the Lua fallback ignores the flow', () => {
  test('no FLOW (nor BLOCK) reaches the script', async () => {
    const { client, sent } = recorder(grant);
    const limiter = new Limiter(client, { backend: 'lua' });
    const b = limiter.bucket('fs:k', '50', 1);
    await b.acquire(1, { timeoutMs: 5000, flow: 'acme', weight: 3 });
    await b.lease(1, { ttlMs: 1000, flow: 'acme' });
    await limiter.acquireMany([[b, 1]], { timeoutMs: 5000, flow: 'acme' });
    assert.equal(sent.length, 3);
    for (const cmd of sent) {
      assert.equal(cmd[0], 'EVALSHA');
      assert.ok(!cmd.includes('FLOW') && !cmd.includes('BLOCK') && !cmd.includes('WEIGHT'), cmd.join(' '));
    }
  });
});

describe('BucketInfo: waiting and flows', () => {
  const base = ['tokens', '0', 'capacity', '1', 'rate', '50', 'updated_at_ms', '1', 'reset_after_ms', '20', 'ttl_ms', '20'];

  test('absent while nothing waits', () => {
    const info = BucketInfo.fromReply(base);
    assert.equal(info.waiting, 0);
    assert.deepEqual(info.flows, []);
  });

  test('read from waiting and waiting_flows, in the server order', () => {
    const info = BucketInfo.fromReply([
      ...base,
      'waiting',
      12,
      'waiting_flows',
      [Buffer.from('b'), 3, 2, 'a', '1', '10'],
    ]);
    assert.equal(info.waiting, 12);
    assert.deepEqual(info.flows, [
      { name: 'b', weight: 3, waiting: 2 },
      { name: 'a', weight: 1, waiting: 10 },
    ]);
    assert.ok(Object.isFrozen(info.flows) && Object.isFrozen(info.flows[0]));
    assert.equal(info.tokens, 0);
  });
});
