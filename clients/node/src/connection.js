// How one command reaches Redis through the client object the user passed in:
// node-redis 4+ (a client or a cluster) or ioredis 5+ (Redis or Cluster).
//
// A command is `head`, then its keys, then `tail`: ['TB.CONSUME'] key
// [rate ...], ['TB.MCONSUME', numkeys] keys [...], ['EVALSHA', sha,
// numkeys] keys ['TB.CONSUME', ...]. Knowing the keys,
// - cluster clients route each command to the node that owns its first key,
//   although neither library knows the module's commands (they would send
//   them to a random node, which answers MOVED);
// - the client's `keyPrefix` (ioredis, node-redis 6) applies to module
//   commands and to the Lua script alike: the libraries prefix only the
//   keys of commands they know (ioredis prefixes EVALSHA's keys itself;
//   node-redis prefixes nothing sent with sendCommand), so the adapter
//   prefixes the rest.
//
// The libraries are typed here by what the adapter uses of them (every
// supported version of each fits), not imported: the package works with
// whichever of them the user has, in any version it supports.

/** @import { Key } from './index.js' */

/**
 * What the adapter uses of a node-redis 4, 5 or 6 client or cluster.
 * @typedef {Object} NodeRedisClient
 * @property {(...args: unknown[]) => Promise<unknown>} sendCommand `(args)` on a client, `(firstKey, isReadonly, args)` on a cluster
 * @property {(overrides?: object) => NodeRedisClient} duplicate
 * @property {() => Promise<unknown>} connect
 * @property {(event: string, listener: (...args: unknown[]) => void) => unknown} on
 * @property {() => unknown} disconnect
 * @property {() => unknown} [destroy] node-redis 5+
 * @property {unknown} [getSlotMaster] clusters only
 * @property {string | Buffer} [_keyPrefix] node-redis 6's prefix
 * @property {{ keyPrefix?: string | Buffer, socket?: object }} [options]
 */

/**
 * What the adapter uses of an ioredis 5 or 6 Redis or Cluster.
 * @typedef {Object} IoredisClient
 * @property {(...args: unknown[]) => Promise<unknown>} call
 * @property {(command: { keys?: unknown }, ...rest: unknown[]) => unknown} sendCommand
 * @property {boolean} [isCluster]
 * @property {(...args: unknown[]) => IoredisClient} duplicate
 * @property {(event: string, listener: (...args: unknown[]) => void) => unknown} on
 * @property {() => unknown} disconnect
 * @property {{ keyPrefix?: string, redisOptions?: object, enableAutoPipelining?: boolean }} options
 */

/** A command's parts after the head: keys, then arguments. @typedef {ReadonlyArray<string | Buffer>} Parts */

/** One interface over both libraries. @typedef {NodeRedisConnection | IoredisConnection} Connection */

/**
 * Wraps a node-redis or ioredis client (or cluster) in one interface:
 * `send(head, keys, tail)`.
 *
 * @param {unknown} client
 * @returns {Connection}
 */
export function connect(client) {
  if (client == null || typeof client !== 'object') {
    throw new TypeError('expected a node-redis or ioredis client (or cluster) object');
  }
  const c = /** @type {Record<string, unknown>} */ (client);
  if (typeof c.call === 'function' && typeof c.sendCommand === 'function' && 'isCluster' in c) {
    return new IoredisConnection(/** @type {IoredisClient} */ (client));
  }
  if (typeof c.sendCommand === 'function' && typeof c.duplicate === 'function') {
    return new NodeRedisConnection(/** @type {NodeRedisClient} */ (client));
  }
  throw new TypeError('expected a node-redis (4+) or ioredis (5+) client (or cluster) object');
}

/**
 * `key` with `prefix` (a string or Buffer) in front, as the client would.
 * @param {string | Buffer | null | undefined} prefix
 * @param {Key} key
 * @returns {Key}
 */
function prefixed(prefix, key) {
  if (prefix == null || prefix === '') return key;
  if (Buffer.isBuffer(prefix) || Buffer.isBuffer(key)) {
    return Buffer.concat([Buffer.from(prefix), Buffer.from(key)]);
  }
  return prefix + key;
}

/** node-redis 4, 5 and 6: `sendCommand(args)`; clusters take the first key. */
class NodeRedisConnection {
  /** @param {NodeRedisClient} client */
  constructor(client) {
    this.client = client;
    // Clusters: v4 has getSlotMaster(), v5+ too (and masters, slots).
    this.isCluster = typeof client.getSlotMaster === 'function';
    /** Closes a dedicated connection this one was duplicated into (set by `duplicate`). @type {(() => unknown) | undefined} */
    this.close = undefined;
  }

  /**
   * @param {ReadonlyArray<string>} head
   * @param {ReadonlyArray<Key>} keys
   * @param {Parts} tail
   * @returns {Promise<unknown>}
   */
  send(head, keys, tail) {
    const c = this.client;
    const ks = keys.map((k) => prefixed(c._keyPrefix ?? c.options?.keyPrefix, k));
    const args = [...head, ...ks, ...tail];
    return this.isCluster ? c.sendCommand(ks[0], false, args) : c.sendCommand(args);
  }

  /**
   * A command without keys, sent where `key` lives (SCRIPT LOAD in a cluster).
   * @param {Key} key
   * @param {ReadonlyArray<string>} args
   * @returns {Promise<unknown>}
   */
  sendTo(key, args) {
    const c = this.client;
    const k = prefixed(c._keyPrefix ?? c.options?.keyPrefix, key);
    return this.isCluster ? c.sendCommand(k, false, args) : c.sendCommand(args);
  }

  /**
   * A new connection for a server-side BLOCK: the same options, without a
   * socket or command timeout (the wait is bounded by the command itself).
   */
  async duplicate() {
    /** @type {{ commandOptions: undefined, socket?: object }} */
    const overrides = { commandOptions: undefined };
    const socket = this.client.options?.socket;
    if (!this.isCluster && socket) overrides.socket = { ...socket, socketTimeout: undefined };
    const dup = this.client.duplicate(overrides);
    dup.on('error', () => {}); // a dropped dedicated connection surfaces as the command's error
    await dup.connect();
    const conn = new NodeRedisConnection(dup);
    conn.close = () => (typeof dup.destroy === 'function' ? dup.destroy() : dup.disconnect());
    return conn;
  }
}

/** ioredis 5 and 6: Redis and Cluster. */
class IoredisConnection {
  /** @param {IoredisClient} client */
  constructor(client) {
    this.client = client;
    this.isCluster = client.isCluster === true;
    /** Closes a dedicated connection this one was duplicated into (set by `duplicate`). @type {(() => unknown) | undefined} */
    this.close = undefined;
  }

  /**
   * @param {ReadonlyArray<string>} head
   * @param {ReadonlyArray<Key>} keys
   * @param {Parts} tail
   * @returns {Promise<unknown>}
   */
  send(head, keys, tail) {
    const ks = keys.map((k) => prefixed(this.client.options?.keyPrefix, k));
    // EVALSHA and EVAL ioredis knows: it prefixes their keys itself.
    const known = /^EVAL(SHA)?$/i.test(head[0]);
    return this._routed(ks, [...head, ...(known ? keys : ks), ...tail]);
  }

  /**
   * A command without keys, sent where `key` lives (SCRIPT LOAD in a cluster).
   * @param {Key} key
   * @param {ReadonlyArray<string>} args
   * @returns {Promise<unknown>}
   */
  sendTo(key, args) {
    return this._routed([prefixed(this.client.options?.keyPrefix, key)], args);
  }

  /**
   * ioredis finds the keys only of commands it knows. `call` builds the
   * command; this view of the client sets its keys before it is sent, so a
   * Cluster routes it by the first one (without them it would go to any
   * node, and follow a MOVED reply if there is one). Auto-pipelining is off
   * in this view: its batches are routed by the keys ioredis finds.
   * @internal
   * @param {ReadonlyArray<Key>} keys
   * @param {Parts} args
   * @returns {Promise<unknown>}
   */
  _routed(keys, args) {
    const c = this.client;
    /** @type {IoredisClient} */
    const routed = Object.create(c, {
      options: { value: { ...c.options, enableAutoPipelining: false } },
      sendCommand: {
        /**
         * @param {{ keys?: unknown }} command
         * @param {unknown[]} rest
         */
        value(command, ...rest) {
          command.keys = keys;
          return c.sendCommand(command, ...rest);
        },
      },
    });
    return c.call.call(routed, ...args);
  }

  async duplicate() {
    // No commandTimeout: a BLOCK would fail with it, and fail the next
    // command queued behind (ioredis multiplexes one connection).
    const c = this.client;
    const dup = this.isCluster
      ? c.duplicate([], { redisOptions: { ...c.options.redisOptions, commandTimeout: undefined } })
      : c.duplicate({ commandTimeout: undefined });
    dup.on('error', () => {}); // a dropped dedicated connection surfaces as the command's error
    const conn = new IoredisConnection(dup);
    conn.close = () => dup.disconnect();
    return conn;
  }
}

