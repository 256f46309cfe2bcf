import type { Key } from './index.js';
import type { MultiResult, Result } from './results.js';
/**
 * The tokens cannot be had within the timeout (or ever: `result.never`).
 * Thrown by `acquire` and `acquireMany`; nothing was taken.
 */
export declare class RateLimited extends Error {
    /** @readonly @type {'RateLimited'} */
    readonly name: 'RateLimited';
    /** The key (or keys, joined with commas) that said no. @readonly @type {Key} */
    readonly key: Key;
    /** The reply that said so. @readonly @type {Result | MultiResult} */
    readonly result: Result | MultiResult;
    /**
     * @param {Key} key
     * @param {Result | MultiResult} result
     */
    constructor(key: Key, result: Result | MultiResult);
    /** Milliseconds until the same request would succeed; -1 for never. */
    get retryAfterMs(): number;
}
/**
 * The server refused a command: bad arguments, WRONGTYPE, NOPERM, OOM, a wait
 * above `tb.max-wait-ms`... `message` is the server's; `cause` the client
 * library's error. Nothing changed on the server.
 */
export declare class CommandError extends Error {
    /** @readonly @type {'CommandError'} */
    readonly name: 'CommandError';
    /** The command the server refused (`TB.CONSUME`, ...). @readonly @type {string} */
    readonly command: string;
    /**
     * @param {string} command
     * @param {unknown} cause the client library's error
     */
    constructor(command: string, cause: unknown);
}
/**
 * Thrown (or wrapped, as `cause`) by the body of a lease for a failure known
 * to happen before the request left (connection refused, a validation
 * error): the lease's tokens are given back in full. Any other exception
 * keeps them (see {@link Lease}).
 */
export declare class NotSentError extends Error {
    /** @readonly @type {'NotSentError'} */
    readonly name: 'NotSentError';
    /**
     * @param {string} [message]
     * @param {{ cause?: unknown }} [options]
     */
    constructor(message?: string, options?: {
        cause?: unknown;
    });
}
/**
 * Whether `e` (or an error in its `cause` chain) is a NotSentError.
 * @param {unknown} e
 * @returns {boolean}
 */
export declare function isNotSent(e: unknown): boolean;
/**
 * A key as error messages show it (JSON, a Buffer's bytes as Latin-1).
 * @param {Key} key
 * @returns {string}
 */
export declare function describeKey(key: Key): string;
/**
 * Whether `e` is an error reply of the server (not a connection failure).
 * @param {unknown} e
 * @returns {e is Error}
 */
export declare function isReplyError(e: unknown): e is Error;
/**
 * A server's error reply to `command` as a CommandError; any other error as it is.
 * @param {string} command
 * @param {unknown} e
 * @returns {unknown}
 */
export declare function asCommandError(command: string, e: unknown): unknown;
/**
 * Whether `e` is the server's "unknown command" (no module): the Lua fallback's cue.
 * @param {unknown} e
 * @returns {boolean}
 */
export declare function isUnknownCommand(e: unknown): boolean;
/**
 * N from the server's `ERR wait exceeds tb.max-wait-ms (N)`, or null.
 * @param {unknown} e
 * @returns {number | null}
 */
export declare function maxWaitFrom(e: unknown): number | null;
