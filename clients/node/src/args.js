// Arguments checked as the server checks them, before any round trip, and
// the waits between calls.

import { setTimeout as sleep } from 'node:timers/promises';

/** @import { Amount, Rate } from './index.js' */

import { ERR_FLOW_NAME, ERR_WEIGHT, MAX_AMOUNT, MAX_FLOW_NAME, MAX_WEIGHT, MAX_WAIT_MS as MAX_WAIT_ARG_MS } from './catalogue.js';

/**
 * A rate as the commands take it: `'10'`, `'0.5'`, `'100/m'`, `'1e-3'`, or a number.
 * @param {Rate} rate
 * @returns {string}
 */
export function rateArg(rate) {
  if (typeof rate === 'string') return rate;
  if (typeof rate === 'number') {
    if (!Number.isFinite(rate) || rate < 0) throw new RangeError(`rate must be finite and >= 0, got ${rate}`);
    return String(rate); // shortest exact spelling: 0.5, 1e-7, 2500000000
  }
  throw new TypeError(`rate must be a string or a number, not ${typeof rate}`);
}

/**
 * A token count: an integer from 0 to 2^53 (a number or a bigint).
 * @param {Amount} n
 * @param {string} [what] the argument's name in the error
 * @returns {string}
 */
export function amountArg(n, what = 'n') {
  if (typeof n === 'bigint') {
    if (n < 0n || n > BigInt(MAX_AMOUNT)) throw new RangeError(`${what} must be from 0 to 2^53, got ${n}`);
    return n.toString();
  }
  if (typeof n !== 'number' || !Number.isInteger(n)) throw new TypeError(`${what} must be an integer, got ${n}`);
  if (n < 0 || n > MAX_AMOUNT) throw new RangeError(`${what} must be from 0 to 2^53, got ${n}`);
  return String(n);
}

/**
 * A wait in milliseconds, rounded down so the server never waits longer than asked.
 * @param {number} ms
 * @param {string} what the argument's name in the error
 * @returns {number}
 */
export function waitArg(ms, what) {
  if (typeof ms !== 'number' || !(ms >= 0) || ms === Infinity) {
    throw new RangeError(`${what} must be a finite number of milliseconds >= 0, got ${ms}`);
  }
  return Math.min(Math.floor(ms), MAX_WAIT_ARG_MS);
}

/**
 * `FLOW name [WEIGHT w]` (WEIGHT left out when 1), or nothing without a
 * flow; checked as the server checks them, before any round trip: a name
 * of the wrong size or a weight out of range is a RangeError with the
 * server's error line (a string is counted in UTF-8 bytes).
 * @param {string | Buffer | undefined | null} flow
 * @param {number | undefined | null} weight
 * @returns {(string | Buffer)[]}
 */
export function flowArgs(flow, weight = 1) {
  const w = weight ?? 1;
  if (typeof w !== 'number') throw new TypeError(`weight must be a number, not ${typeof w}`);
  if (flow === undefined || flow === null) {
    if (w !== 1) throw new RangeError(ERR_WEIGHT);
    return [];
  }
  if (typeof flow !== 'string' && !Buffer.isBuffer(flow)) {
    throw new TypeError(`flow must be a string or a Buffer, not ${typeof flow}`);
  }
  const bytes = Buffer.isBuffer(flow) ? flow.length : Buffer.byteLength(flow);
  if (bytes < 1 || bytes > MAX_FLOW_NAME) throw new RangeError(ERR_FLOW_NAME);
  if (!Number.isInteger(w) || w < 1 || w > MAX_WEIGHT) throw new RangeError(ERR_WEIGHT);
  return w === 1 ? ['FLOW', flow] : ['FLOW', flow, 'WEIGHT', String(w)];
}

/**
 * Waits `ms`; an aborted `signal` ends the wait with its reason.
 * @param {number} ms
 * @param {AbortSignal} [signal]
 * @returns {Promise<void>}
 */
export async function pause(ms, signal) {
  try {
    await sleep(ms, undefined, { signal });
  } catch (e) {
    throw signal?.aborted ? signal.reason : e;
  }
}

/**
 * Waits `ms` for a reservation; if `signal` aborts first, runs `giveBack`, then throws the reason.
 * @param {number} ms
 * @param {AbortSignal | undefined} signal
 * @param {() => Promise<unknown>} giveBack
 * @returns {Promise<void>}
 */
export async function waitReserved(ms, signal, giveBack) {
  try {
    await pause(ms, signal);
  } catch (e) {
    if (signal?.aborted) {
      // The reservation is ours and will not be used: give it back. Best
      // effort: if the refund fails too, the tokens stay taken (the safe side).
      await giveBack().catch(() => {});
    }
    throw e;
  }
}
