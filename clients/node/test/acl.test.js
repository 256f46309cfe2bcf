// The least-privilege users: the limiter user of docs/security.md (module commands on
// rl:* keys, nothing else) needs nothing more from the Node client, and the
// Lua fallback's user needs EVALSHA and EVAL and the commands the script
// calls instead. Backend detection sends no probe and reads no key.

import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import { CommandError, Limiter } from 'tb-limiter';

import { LIBRARIES } from './helpers/clients.js';
import { servers } from './helpers/fixtures.js';

const USERS = {
  // docs/security.md, "ACL": the least-privilege line for an application that only rate-limits.
  module: 'limiter on >secret resetkeys ~rl:* resetchannels -@all +tb.consume +tb.mconsume +tb.refund +tb.info +cl.throttle',
  // The same for the Lua fallback: the script, and the commands it calls
  // (scripts run with the caller's permissions).
  lua: 'limiter on >secret resetkeys ~rl:* resetchannels -@all +evalsha +eval +time +type +hmget +hset +del +persist +pexpireat +pttl',
};

// Without EVAL: the client loads the script with SCRIPT LOAD after a NOSCRIPT.
const LUA_WITH_SCRIPT_LOAD = USERS.lua.replace('+eval ', '+script|load ');

const env = servers();

for (const lib of LIBRARIES) {
  for (const backend of ['module', 'lua']) {
    describe(`${lib.name}, ${backend}`, () => {
      test('the least-privilege user can use every method, and nothing else', async (t) => {
        const admin = env.admin(backend);
        await admin.flushall();
        await admin.call('ACL', 'SETUSER', ...USERS[backend].split(' '));
        // (ioredis' ready check runs INFO, which this user may not.)
        const auth = { username: 'limiter', password: 'secret', ...(lib.kind === 'ioredis' && { enableReadyCheck: false }) };
        const client = await lib.connect(env.server(backend).port, auth);
        const limiter = new Limiter(client);
        t.after(async () => {
          await limiter.close();
          await lib.close(client);
          await admin.call('ACL', 'DELUSER', 'limiter');
        });
        const b = limiter.bucket('rl:user:1', 1, 3);
        assert.equal((await b.consume()).remaining, 2);
        assert.equal(limiter.backend, backend);
        assert.equal((await b.reserve(3, { maxWaitMs: 10_000 })).allowed, true);
        assert.equal(await b.refund(2), 1);
        assert.equal((await b.info()).capacity, 3);
        const many = await limiter.consumeMany([[limiter.bucket('rl:{t}a', 1, 3), 1], [limiter.bucket('rl:{t}b', 1, 3), 1]]);
        assert.deepEqual(many.remaining, [2, 2]);
        assert.equal((await limiter.bucket('rl:w', 5, 1).acquire(1, { timeoutMs: 1000 })).allowed, true);
        // Keys outside rl:* are refused, whichever backend.
        await assert.rejects(limiter.bucket('other', 1, 3).consume(), (e) => e instanceof CommandError && /NOPERM/.test(e.message));
      });

      if (backend === 'lua') {
        test('a user allowed SCRIPT LOAD instead of EVAL', async (t) => {
          const admin = env.admin(backend);
          await admin.flushall();
          await admin.script('FLUSH');
          await admin.call('ACL', 'SETUSER', ...LUA_WITH_SCRIPT_LOAD.split(' '));
          const auth = { username: 'limiter', password: 'secret', ...(lib.kind === 'ioredis' && { enableReadyCheck: false }) };
          const client = await lib.connect(env.server(backend).port, auth);
          const limiter = new Limiter(client);
          t.after(async () => {
            await limiter.close();
            await lib.close(client);
            await admin.call('ACL', 'DELUSER', 'limiter');
          });
          const b = limiter.bucket('rl:user:2', 1, 3);
          assert.equal((await b.consume()).remaining, 2);
          await admin.script('FLUSH');
          assert.equal((await b.consume()).remaining, 1, 'loaded again after a SCRIPT FLUSH');
        });
      }
    });
  }
}
