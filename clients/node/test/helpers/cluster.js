// A Redis Cluster on loopback for the Node tests, as in the Rust and Python
// harnesses: three masters (no replicas: routing is what the client tests
// need), each a Server on a free port whose bus port (+10000) is free too,
// made with `redis-cli --cluster create ... --cluster-yes`. Every wait has a
// deadline; nodes are stopped by pid.
//
// REDIS_CLI is the redis-cli binary (default: redis-cli on PATH).

import { execFile, spawnSync } from 'node:child_process';
import net from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { promisify } from 'node:util';

import Redis from 'ioredis';

import { Server, freePort } from './server.js';

const CLI_DEADLINE_MS = 120_000;
const STABLE_DEADLINE_MS = 60_000;

function redisCli() {
  const name = process.env.REDIS_CLI || 'redis-cli';
  const found = name.includes('/') ? name : spawnSync('sh', ['-c', `command -v ${name}`], { encoding: 'utf8' }).stdout.trim();
  if (!found) throw new Error(`${name} not found: run 'make test-node', which installs redis-tools`);
  return found;
}

function canBind(port) {
  return new Promise((resolve) => {
    const srv = net.createServer();
    srv.once('error', () => resolve(false));
    srv.listen(port, '127.0.0.1', () => srv.close(() => resolve(true)));
  });
}

/** A free port whose cluster bus port (port + 10000) is free too. */
async function freeClusterPort() {
  for (let i = 0; i < 100; i++) {
    const p = await freePort();
    if (p + 10000 < 65536 && (await canBind(p + 10000))) return p;
  }
  throw new Error('no free port pair for a cluster node');
}

export class Cluster {
  /** Three masters with (or without) the module. */
  static async start({ module = true } = {}) {
    const c = new Cluster();
    c.nodes = [];
    try {
      for (let i = 0; i < 3; i++) {
        c.nodes.push(
          await Server.start({
            module,
            port: await freeClusterPort(),
            args: ['--cluster-enabled', 'yes', '--cluster-config-file', 'nodes.conf', '--cluster-node-timeout', '5000'],
          }),
        );
      }
      c.admins = c.nodes.map((n) => new Redis(n.port, '127.0.0.1', { maxRetriesPerRequest: 1 }));
      const addrs = c.nodes.map((n) => `127.0.0.1:${n.port}`);
      await promisify(execFile)(redisCli(), ['--cluster', 'create', ...addrs, '--cluster-replicas', '0', '--cluster-yes'], {
        timeout: CLI_DEADLINE_MS,
      });
      await c._waitStable();
    } catch (e) {
      await c.stop();
      throw e;
    }
    return c;
  }

  get ports() {
    return this.nodes.map((n) => n.port);
  }

  async _waitStable() {
    const deadline = Date.now() + STABLE_DEADLINE_MS;
    let last = '';
    while (Date.now() < deadline) {
      const infos = await Promise.all(this.admins.map((a) => a.cluster('INFO')));
      last = infos.join('\n');
      if (infos.every((i) => i.includes('cluster_state:ok') && i.includes('cluster_known_nodes:3'))) return;
      await sleep(100);
    }
    throw new Error(`the cluster did not become stable within ${STABLE_DEADLINE_MS} ms:\n${last}`);
  }

  /** The admin connection of the master that serves `key`. */
  async adminFor(key) {
    const slot = await this.admins[0].cluster('KEYSLOT', key);
    for (const [start, end, [, port]] of await this.admins[0].cluster('SLOTS')) {
      if (slot >= start && slot <= end) return this.admins[this.ports.indexOf(Number(port))];
    }
    throw new Error(`no node serves ${key}`);
  }

  /** Empties every node and zeroes its statistics (errorstats included). */
  async reset() {
    for (const a of this.admins) {
      await a.flushall();
      await a.config('RESETSTAT');
    }
  }

  /** MOVED and ASK redirections the nodes have answered since reset(). */
  async redirections() {
    let total = 0;
    for (const a of this.admins) {
      for (const m of (await a.info('errorstats')).matchAll(/errorstat_(?:MOVED|ASK):count=(\d+)/g)) total += Number(m[1]);
    }
    return total;
  }

  async stop() {
    for (const a of this.admins ?? []) a.disconnect();
    for (const n of this.nodes) await n.stop();
  }
}
