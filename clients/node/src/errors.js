// Errors of tb-limiter, and how the client libraries' errors are told apart.

import { ERR_WAIT_EXCEEDS } from './catalogue.js';

/**
 * The tokens cannot be had within the timeout (or ever: `result.never`).
 * Thrown by `acquire` and `acquireMany`; nothing was taken.
 */
export class RateLimited extends Error {
  constructor(key, result) {
    const why = result.never ? 'can never be satisfied' : `needs ${result.retryAfterMs} ms`;
    super(`rate limited on ${describeKey(key)}: ${why}`);
    this.name = 'RateLimited';
    /** The key (or keys, joined with commas) that said no. */
    this.key = key;
    /** The reply that said so. */
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
  constructor(command, cause) {
    super(String(cause?.message ?? cause), { cause });
    this.name = 'CommandError';
    /** The command the server refused (`TB.CONSUME`, ...). */
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
  constructor(message = 'the request was not sent', options) {
    super(message, options);
    this.name = 'NotSentError';
  }
}

/** Whether `e` (or an error in its `cause` chain) is a NotSentError. */
export function isNotSent(e) {
  for (let x = e, depth = 0; x && depth < 16; x = x.cause, depth++) {
    if (x instanceof NotSentError || x?.name === 'NotSentError') return true;
  }
  return false;
}

export function describeKey(key) {
  return Buffer.isBuffer(key) ? JSON.stringify(key.toString('latin1')) : JSON.stringify(String(key));
}

/** Whether `e` is an error reply of the server (not a connection failure). */
export function isReplyError(e) {
  for (let p = e; p && p !== Error.prototype; p = Object.getPrototypeOf(p)) {
    const name = p.constructor?.name;
    // ioredis: ReplyError; node-redis: ErrorReply (SimpleError, BlobError).
    if (name === 'ReplyError' || name === 'ErrorReply') return true;
  }
  return false;
}

export function asCommandError(command, e) {
  return isReplyError(e) ? new CommandError(command, e) : e;
}

export function isUnknownCommand(e) {
  return isReplyError(e) && /unknown command/i.test(String(e.message));
}

/** The module's error for a wait above `tb.max-wait-ms`, with the setting's value. */
const MAX_WAIT_ERROR = new RegExp(
  ERR_WAIT_EXCEEDS.slice(4).replace(/[.*+?^${}()|[\]\\]/g, '\\$&').replace('\\(\\{\\}\\)', '\\((\\d+)\\)'),
);

/** N from the server's `ERR wait exceeds tb.max-wait-ms (N)`, or null. */
export function maxWaitFrom(e) {
  const m = MAX_WAIT_ERROR.exec(String(e?.message ?? ''));
  return m ? Number(m[1]) : null;
}
