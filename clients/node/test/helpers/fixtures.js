// Shared set-up of the suites: one server with the module and one without
// (where the client falls back to the Lua script), started once per test
// file, and an admin connection to each for inspecting the server.

import { after, before } from 'node:test';

import Redis from 'ioredis';

import { Server } from './server.js';

/** The two backends every client test runs on. */
export const BACKENDS = ['module', 'lua'];

/**
 * Registers before/after hooks that start both servers; returns an object
 * whose `server(backend)` and `admin(backend)` work inside tests.
 */
export function servers() {
  const state = { servers: {}, admins: {} };
  before(async () => {
    state.servers.module = await Server.start({ module: true });
    state.servers.lua = await Server.start({ module: false });
    for (const b of BACKENDS) {
      state.admins[b] = new Redis(state.servers[b].port, '127.0.0.1', { maxRetriesPerRequest: 1 });
    }
  });
  after(async () => {
    for (const b of BACKENDS) {
      await state.admins[b]?.quit();
      await state.servers[b]?.stop();
    }
  });
  return {
    server: (backend) => state.servers[backend],
    admin: (backend) => state.admins[backend],
  };
}

/** Counters from one INFO section of the server, as numbers where they are. */
export async function info(admin, section) {
  const out = {};
  for (const line of (await admin.info(section)).split('\r\n')) {
    const i = line.indexOf(':');
    if (i > 0) out[line.slice(0, i)] = line.slice(i + 1);
  }
  return out;
}

/** TB.CONSUME, TB.MCONSUME, EVALSHA and EVAL calls the server has run so far. */
export async function limiterCalls(admin) {
  const stats = await info(admin, 'commandstats');
  let total = 0;
  for (const name of ['cmdstat_tb.consume', 'cmdstat_tb.mconsume', 'cmdstat_evalsha', 'cmdstat_eval']) {
    const m = /calls=(\d+)/.exec(stats[name] ?? '');
    if (m) total += Number(m[1]);
  }
  return total;
}
