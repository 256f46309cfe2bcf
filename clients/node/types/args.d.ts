import type { Amount, Rate } from './index.js';
/**
 * A rate as the commands take it: `'10'`, `'0.5'`, `'100/m'`, `'1e-3'`, or a number.
 * @param {Rate} rate
 * @returns {string}
 */
export declare function rateArg(rate: Rate): string;
/**
 * A token count: an integer from 0 to 2^53 (a number or a bigint).
 * @param {Amount} n
 * @param {string} [what] the argument's name in the error
 * @returns {string}
 */
export declare function amountArg(n: Amount, what?: string): string;
/**
 * A wait in milliseconds, rounded down so the server never waits longer than asked.
 * @param {number} ms
 * @param {string} what the argument's name in the error
 * @returns {number}
 */
export declare function waitArg(ms: number, what: string): number;
/**
 * `FLOW name [WEIGHT w]` (WEIGHT left out when 1), or nothing without a
 * flow; checked as the server checks them, before any round trip: a name
 * of the wrong size or a weight out of range is a RangeError with the
 * server's error line (a string is counted in UTF-8 bytes).
 * @param {string | Buffer | undefined | null} flow
 * @param {number | undefined | null} weight
 * @returns {(string | Buffer)[]}
 */
export declare function flowArgs(flow: string | Buffer | undefined | null, weight?: number | undefined | null): (string | Buffer)[];
/**
 * Waits `ms`; an aborted `signal` ends the wait with its reason.
 * @param {number} ms
 * @param {AbortSignal} [signal]
 * @returns {Promise<void>}
 */
export declare function pause(ms: number, signal?: AbortSignal): Promise<void>;
/**
 * Waits `ms` for a reservation; if `signal` aborts first, runs `giveBack`, then throws the reason.
 * @param {number} ms
 * @param {AbortSignal | undefined} signal
 * @param {() => Promise<unknown>} giveBack
 * @returns {Promise<void>}
 */
export declare function waitReserved(ms: number, signal: AbortSignal | undefined, giveBack: () => Promise<unknown>): Promise<void>;
