import type { Key } from './index.js';
export type NodeRedisClient = {
    /**
     * `(args)` on a client, `(firstKey, isReadonly, args)` on a cluster
     */
    sendCommand: (...args: unknown[]) => Promise<unknown>;
    duplicate: (overrides?: object) => NodeRedisClient;
    connect: () => Promise<unknown>;
    on: (event: string, listener: (...args: unknown[]) => void) => unknown;
    disconnect: () => unknown;
    /**
     * node-redis 5+
     */
    destroy?: () => unknown;
    /**
     * clusters only
     */
    getSlotMaster?: unknown;
    /**
     * node-redis 6's prefix
     */
    _keyPrefix?: string | Buffer;
    options?: {
        keyPrefix?: string | Buffer;
        socket?: object;
    };
};
export type IoredisClient = {
    call: (...args: unknown[]) => Promise<unknown>;
    sendCommand: (command: {
        keys?: unknown;
    }, ...rest: unknown[]) => unknown;
    isCluster?: boolean;
    duplicate: (...args: unknown[]) => IoredisClient;
    on: (event: string, listener: (...args: unknown[]) => void) => unknown;
    disconnect: () => unknown;
    options: {
        keyPrefix?: string;
        redisOptions?: object;
        enableAutoPipelining?: boolean;
    };
};
export type Parts = ReadonlyArray<string | Buffer>;
export type Connection = NodeRedisConnection | IoredisConnection;
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
export declare function connect(client: unknown): Connection;
/** node-redis 4, 5 and 6: `sendCommand(args)`; clusters take the first key. */
declare class NodeRedisConnection {
    client: NodeRedisClient;
    isCluster: boolean;
    /** Closes a dedicated connection this one was duplicated into (set by `duplicate`). @type {(() => unknown) | undefined} */
    close: (() => unknown) | undefined;
    /** @param {NodeRedisClient} client */
    constructor(client: NodeRedisClient);
    /**
     * @param {ReadonlyArray<string>} head
     * @param {ReadonlyArray<Key>} keys
     * @param {Parts} tail
     * @returns {Promise<unknown>}
     */
    send(head: ReadonlyArray<string>, keys: ReadonlyArray<Key>, tail: Parts): Promise<unknown>;
    /**
     * A command without keys, sent where `key` lives (SCRIPT LOAD in a cluster).
     * @param {Key} key
     * @param {ReadonlyArray<string>} args
     * @returns {Promise<unknown>}
     */
    sendTo(key: Key, args: ReadonlyArray<string>): Promise<unknown>;
    /**
     * A new connection for a server-side BLOCK: the same options, without a
     * socket or command timeout (the wait is bounded by the command itself).
     */
    duplicate(): Promise<NodeRedisConnection>;
}
/** ioredis 5 and 6: Redis and Cluster. */
declare class IoredisConnection {
    client: IoredisClient;
    isCluster: boolean;
    /** Closes a dedicated connection this one was duplicated into (set by `duplicate`). @type {(() => unknown) | undefined} */
    close: (() => unknown) | undefined;
    /** @param {IoredisClient} client */
    constructor(client: IoredisClient);
    /**
     * @param {ReadonlyArray<string>} head
     * @param {ReadonlyArray<Key>} keys
     * @param {Parts} tail
     * @returns {Promise<unknown>}
     */
    send(head: ReadonlyArray<string>, keys: ReadonlyArray<Key>, tail: Parts): Promise<unknown>;
    /**
     * A command without keys, sent where `key` lives (SCRIPT LOAD in a cluster).
     * @param {Key} key
     * @param {ReadonlyArray<string>} args
     * @returns {Promise<unknown>}
     */
    sendTo(key: Key, args: ReadonlyArray<string>): Promise<unknown>;
    duplicate(): Promise<IoredisConnection>;
}
export {};
