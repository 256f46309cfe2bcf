// The client libraries the package supports, at the newest majors npm
// installs today and the oldest majors it allows (npm aliases in
// devDependencies): every suite runs its tests through each.

import Redis6, { Cluster as Cluster6 } from 'ioredis';
import Redis5, { Cluster as Cluster5 } from 'ioredis5';
import * as nodeRedis6 from 'redis';
import * as nodeRedis4 from 'redis4';

function nodeRedis(lib, major) {
  return {
    name: `node-redis ${major}`,
    major,
    kind: 'node-redis',
    async connect(port, options = {}) {
      const c = lib.createClient({ url: `redis://127.0.0.1:${port}`, ...options });
      c.on('error', () => {});
      await c.connect();
      return c;
    },
    async connectCluster(ports, options = {}) {
      const c = lib.createCluster({
        rootNodes: ports.map((p) => ({ url: `redis://127.0.0.1:${p}` })),
        ...options,
      });
      c.on('error', () => {});
      await c.connect();
      return c;
    },
    async close(c) {
      if (typeof c.close === 'function') await c.close();
      else await c.quit();
    },
  };
}

function ioredis(Redis, Cluster, major) {
  return {
    name: `ioredis ${major}`,
    major,
    kind: 'ioredis',
    async connect(port, options = {}) {
      const c = new Redis(port, '127.0.0.1', { maxRetriesPerRequest: 1, ...options });
      c.on('error', () => {});
      try {
        await new Promise((resolve, reject) => {
          c.once('ready', resolve);
          c.once('end', () => reject(new Error('the connection ended before it was ready')));
        });
      } catch (e) {
        c.disconnect();
        throw e;
      }
      return c;
    },
    async connectCluster(ports, options = {}) {
      const c = new Cluster(
        ports.map((port) => ({ host: '127.0.0.1', port })),
        options,
      );
      c.on('error', () => {});
      await new Promise((resolve, reject) => {
        c.once('ready', resolve);
        c.once('error', reject);
      });
      return c;
    },
    async close(c) {
      await c.quit();
    },
  };
}

/** Every supported library: newest and oldest allowed major of each. */
export const LIBRARIES = [
  nodeRedis(nodeRedis6, 6),
  nodeRedis(nodeRedis4, 4),
  ioredis(Redis6, Cluster6, 6),
  ioredis(Redis5, Cluster5, 5),
];
