// Errors of tb-limiter, and how the client libraries' errors are told apart.

/** @import { Key } from './index.js' */
/** @import { MultiResult, Result } from './results.js' */

import { ERR_WAIT_EXCEEDS } from './catalogue.js';

/**
 * The tokens cannot be had within the timeout (or ever: `result.never`).
 * Thrown by `acquire` and `acquireMany`; nothing was taken.
 */
export class RateLimited extends Error {
  /** @readonly @type {'RateLimited'} */
  name = 'RateLimited';
  /** The key (or keys, joined with commas) that said no. @readonly @type {Key} */
  key;
  /** The reply that said so. @readonly @type {Result | MultiResult} */
  result;

  /**
   * @param {Key} key
   * @param {Result | MultiResult} result
   */
  constructor(key, result) {
    const why = result.never ? 'can never be satisfied' : `needs ${result.retryAfterMs} ms`;
    super(`rate limited on ${describeKey(key)}: ${why}`);
    this.key = key;
    this.result = result;
  }

  /** Milliseconds until the same request would succeed; -1 for never. */
  get retryAfterMs() {
    return this.result.retryAfterMs;
  }
}

/**
 * The server refused a command: bad arguments, WRONGTYPE, NOPERM, OOM, a wait
 * above `tb.max-wait-ms`... `message` is the server's; `cause` the client
 * library's error. Nothing changed on the server.
 */
export class CommandError extends Error {
  /** @readonly @type {'CommandError'} */
  name = 'CommandError';
  /** The command the server refused (`TB.CONSUME`, ...). @readonly @type {string} */
  command;

  /**
   * @param {string} command
   * @param {unknown} cause the client library's error
   */
  constructor(command, cause) {
    super(String(messageOf(cause) ?? cause), { cause });
    this.command = command;
  }
}

/**
 * Thrown (or wrapped, as `cause`) by the body of a lease for a failure known
 * to happen before the request left (connection refused, a validation
 * error): the lease's tokens are given back in full. Any other exception
 * keeps them (see {@link Lease}).
 */
export class NotSentError extends Error {
  /** @readonly @type {'NotSentError'} */
  name = 'NotSentError';

  /**
   * @param {string} [message]
   * @param {{ cause?: unknown }} [options]
   */
  constructor(message = 'the request was not sent', options) {
    super(message, options);
  }
}

/**
 * `e.message` when `e` is an object with one, else undefined.
 * @param {unknown} e
 * @returns {unknown}
 */
function messageOf(e) {
  return typeof e === 'object' && e !== null && 'message' in e ? e.message : undefined;
}

/**
 * Whether `e` (or an error in its `cause` chain) is a NotSentError.
 * @param {unknown} e
 * @returns {boolean}
 */
export function isNotSent(e) {
  /** @type {unknown} */
  let x = e;
  for (let depth = 0; typeof x === 'object' && x !== null && depth < 16; depth++) {
    if (x instanceof NotSentError || ('name' in x && x.name === 'NotSentError')) return true;
    x = 'cause' in x ? x.cause : undefined;
  }
  return false;
}

/**
 * A key as error messages show it (JSON, a Buffer's bytes as Latin-1).
 * @param {Key} key
 * @returns {string}
 */
export function describeKey(key) {
  return Buffer.isBuffer(key) ? JSON.stringify(key.toString('latin1')) : JSON.stringify(String(key));
}

/**
 * Whether `e` is an error reply of the server (not a connection failure).
 * @param {unknown} e
 * @returns {e is Error}
 */
export function isReplyError(e) {
  if (typeof e !== 'object' || e === null) return false;
  for (let p = e; p && p !== Error.prototype; p = Object.getPrototypeOf(p)) {
    const name = p.constructor?.name;
    // ioredis: ReplyError; node-redis: ErrorReply (SimpleError, BlobError).
    if (name === 'ReplyError' || name === 'ErrorReply') return true;
  }
  return false;
}

/**
 * A server's error reply to `command` as a CommandError; any other error as it is.
 * @param {string} command
 * @param {unknown} e
 * @returns {unknown}
 */
export function asCommandError(command, e) {
  return isReplyError(e) ? new CommandError(command, e) : e;
}

/**
 * Whether `e` is the server's "unknown command" (no module): the Lua fallback's cue.
 * @param {unknown} e
 * @returns {boolean}
 */
export function isUnknownCommand(e) {
  return isReplyError(e) && /unknown command/i.test(String(e.message));
}

/** The module's error for a wait above `tb.max-wait-ms`, with the setting's value. */
const MAX_WAIT_ERROR = new RegExp(
  ERR_WAIT_EXCEEDS.slice(4).replace(/[.*+?^${}()|[\]\\]/g, '\\$&').replace('\\(\\{\\}\\)', '\\((\\d+)\\)'),
);

/**
 * N from the server's `ERR wait exceeds tb.max-wait-ms (N)`, or null.
 * @param {unknown} e
 * @returns {number | null}
 */
export function maxWaitFrom(e) {
  const m = MAX_WAIT_ERROR.exec(String(messageOf(e) ?? ''));
  return m ? Number(m[1]) : null;
}
