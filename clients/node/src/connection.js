// How one command reaches Redis through the client object the user passed in:
// node-redis 4+ (a client or a cluster) or ioredis 5+ (Redis or Cluster).
//
// Every command here names its keys, so that
// - cluster clients route it to the node that owns the first key, although
//   neither library knows the module's commands (they would send them to a
//   random node, which answers MOVED);
// - the client's `keyPrefix` (ioredis, node-redis 6) applies to module
//   commands and to the Lua script alike (the libraries prefix only the keys
//   of commands they know, so EVALSHA's keys would be prefixed and
//   TB.CONSUME's would not).

/**
 * Wraps a node-redis or ioredis client (or cluster) in one interface:
 * `send(args, keys)` where `args` is the whole command as strings, and
 * `keys` its keys, already inside `args`.
 *
 * @param {any} client
 * @returns {Connection}
 */
export function connect(client) {
  if (client == null || typeof client !== 'object') {
    throw new TypeError('expected a node-redis or ioredis client (or cluster) object');
  }
  if (typeof client.call === 'function' && typeof client.sendCommand === 'function' && 'isCluster' in client) {
    return new IoredisConnection(client);
  }
  if (typeof client.sendCommand === 'function' && typeof client.duplicate === 'function') {
    return new NodeRedisConnection(client);
  }
  throw new TypeError('expected a node-redis (4+) or ioredis (5+) client (or cluster) object');
}

/** Prefixes each key with `prefix` (a string or Buffer), as the client would. */
function prefixed(prefix, key) {
  if (prefix == null || prefix === '') return key;
  if (Buffer.isBuffer(prefix) || Buffer.isBuffer(key)) {
    return Buffer.concat([Buffer.from(prefix), Buffer.from(key)]);
  }
  return prefix + key;
}

/** The common part: key prefixing and the kind of client. */
class Connection {
  /** @param {any} client */
  constructor(client) {
    this.client = client;
  }

  /** The key as sent to Redis (with the client's keyPrefix). */
  key(key) {
    return prefixed(this.prefix(), key);
  }
}

/** node-redis 4, 5 and 6: `sendCommand(args)`; clusters take the first key. */
class NodeRedisConnection extends Connection {
  constructor(client) {
    super(client);
    // Clusters: v4 has getSlotMaster(), v5+ getSlotRandomNode() and masters.
    this.isCluster = typeof client.getSlotMaster === 'function';
    this.library = 'node-redis';
  }

  prefix() {
    const c = this.client;
    return c._keyPrefix ?? c.options?.keyPrefix;
  }

  send(args, keys) {
    if (this.isCluster) return this.client.sendCommand(keys[0], false, args);
    return this.client.sendCommand(args);
  }

  /**
   * A new connection for a server-side BLOCK: the same options, without a
   * socket or command timeout (the wait is bounded by the command itself).
   */
  async duplicate() {
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
class IoredisConnection extends Connection {
  constructor(client) {
    super(client);
    this.isCluster = client.isCluster === true;
    this.library = 'ioredis';
  }

  prefix() {
    return this.client.options?.keyPrefix;
  }

  /** ioredis' Command class, from the client (Cluster: from one of its nodes). */
  commandClass() {
    const c = this.client;
    if (c.constructor?.Command) return c.constructor.Command;
    const nodes = typeof c.nodes === 'function' ? c.nodes('all') : [];
    return nodes[0]?.constructor?.Command;
  }

  send(args, keys) {
    const Command = this.commandClass();
    if (!Command) {
      // A Cluster before its first connection: ioredis sends commands it
      // does not know to any node and follows the MOVED reply.
      return this.client.call(...args);
    }
    // Without keyPrefix in the options: the keys are prefixed already.
    const cmd = new Command(args[0], args.slice(1), { replyEncoding: 'utf8' });
    // ioredis computes a command's keys only for the commands it knows;
    // setting them routes this one (Cluster) by its first key.
    cmd.keys = keys;
    return this.client.sendCommand(cmd);
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

/** @typedef {NodeRedisConnection | IoredisConnection} Connection */
