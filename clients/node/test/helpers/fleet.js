// The pieces of the end-to-end fleet tests: worker processes started and
// stopped by pid, and the referee, a stand-in for the rate-limited API that
// records when each call started and checks the calls against the bucket's
// contract.

import { spawn } from 'node:child_process';
import http from 'node:http';

const READY_DEADLINE_MS = 60_000;
const STOP_DEADLINE_MS = 20_000;

/**
 * A child process that prints `ready` on stdout when it can work; its
 * output is kept for error messages.
 */
export class Proc {
  static async start(command, args, { env = {}, cwd, ready = 'ready', detached = false, stdin = false } = {}) {
    const p = new Proc();
    p.output = '';
    p.groupLeader = detached;
    p.child = spawn(command, args, {
      cwd,
      env: { ...process.env, ...env },
      stdio: [stdin ? 'pipe' : 'ignore', 'pipe', 'pipe'],
      detached, // its own process group, to stop the children it forks too
    });
    p.exited = new Promise((resolve) => p.child.once('exit', (code, signal) => resolve({ code, signal })));
    const isReady = new Promise((resolve, reject) => {
      const onData = (d) => {
        p.output += d;
        if (p.output.includes(ready)) resolve();
      };
      p.child.stdout.on('data', onData);
      p.child.stderr.on('data', onData);
      p.exited.then(({ code, signal }) => reject(new Error(`${command} exited (${code ?? signal}):\n${p.tail()}`)));
    });
    let timer;
    const deadline = new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error(`${command} not ready within ${READY_DEADLINE_MS} ms:\n${p.tail()}`)), READY_DEADLINE_MS);
    });
    try {
      await Promise.race([isReady, deadline]);
    } catch (e) {
      await p.stop();
      throw e;
    } finally {
      clearTimeout(timer);
    }
    return p;
  }

  tail(lines = 40) {
    return this.output.split('\n').slice(-lines).join('\n');
  }

  /** SIGTERM by pid (to the group if detached), SIGKILL after the deadline. */
  async stop() {
    const { child } = this;
    if (child.exitCode !== null || child.signalCode !== null) return;
    const target = this.groupLeader ? -child.pid : child.pid;
    const kill = (sig) => {
      try {
        process.kill(target, sig);
      } catch {
        // gone already
      }
    };
    kill('SIGTERM');
    const timer = setTimeout(() => kill('SIGKILL'), STOP_DEADLINE_MS);
    await this.exited;
    clearTimeout(timer);
  }
}

/**
 * Starts processes at once; pushes each one that started onto `into` (so
 * the caller stops them) and throws if any failed.
 */
export async function startAll(starts, into) {
  const settled = await Promise.allSettled(starts);
  for (const s of settled) if (s.status === 'fulfilled') into.push(s.value);
  const failed = settled.find((s) => s.status === 'rejected');
  if (failed) throw failed.reason;
  return settled.map((s) => s.value);
}

/** Starts a Node worker process (a fixture) and waits until it is ready. */
export function startNodeWorker(script, env) {
  return Proc.start(process.execPath, [script], { env });
}

/**
 * The rate-limited API: every POST is one call, with the moment the
 * processor started (`startNs`, process.hrtime: CLOCK_MONOTONIC, the same
 * clock in every process of the machine).
 */
export class Referee {
  static async start() {
    const r = new Referee();
    r.calls = [];
    r.replies = [];
    r.waiters = [];
    r.server = http.createServer((req, res) => {
      let body = '';
      req.on('data', (d) => (body += d));
      req.on('end', () => {
        if (req.url === '/replies') {
          for (const g of JSON.parse(body)) {
            r.replies.push({ ...g, sendNs: BigInt(g.sendNs), recvNs: BigInt(g.recvNs) });
          }
        } else {
          const call = JSON.parse(body);
          call.startNs = BigInt(call.startNs);
          call.arrivedNs = process.hrtime.bigint();
          r.calls.push(call);
          for (const w of r.waiters) w();
        }
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end('{}');
      });
    });
    await new Promise((resolve) => r.server.listen(0, '127.0.0.1', resolve));
    r.url = `http://127.0.0.1:${r.server.address().port}/call`;
    return r;
  }

  /** Resolves when `n` calls have arrived; rejects after `ms`. */
  waitForCalls(n, ms) {
    return new Promise((resolve, reject) => {
      const check = () => {
        if (this.calls.length >= n) {
          clearTimeout(timer);
          this.waiters = this.waiters.filter((w) => w !== check);
          resolve(this.calls);
        }
      };
      const timer = setTimeout(() => {
        this.waiters = this.waiters.filter((w) => w !== check);
        reject(new Error(`${this.calls.length} of ${n} calls arrived within ${ms} ms`));
      }, ms);
      this.waiters.push(check);
      check();
    });
  }

  close() {
    return new Promise((resolve) => this.server.close(resolve));
  }
}

/**
 * Checks each call against the grant its job received. A grant is a reply
 * that took tokens for the job, due `retryAfterMs` after the server ran the
 * command, which happened between `sendNs` and `recvNs` (the reply rounds
 * the wait up to a whole millisecond, so the token is due at the earliest
 * 1 ms before sendNs + retryAfterMs, at the latest at recvNs +
 * retryAfterMs); a call has `startNs`. All on the machine-wide monotonic
 * clock. A call is without a token if its job had no grant or if it started
 * before the token could have been due.
 *
 * Returns the count of calls without a token, how late each call started
 * after its token was due at the latest (and after it could have been due
 * at the earliest), the gaps between consecutive calls,
 * the grants no call used, and the pairs of calls made out of turn: the one
 * whose job surely asked the bucket first (its reply came back before the
 * other's request left) called second.
 */
export function matchGrants(calls, grants) {
  const ms = (ns) => Number(ns) / 1e6;
  const byJob = new Map();
  for (const g of grants) byJob.set(g.job, g); // a job's last grant is the one it used
  let without = 0;
  const lateness = [];
  const asked = [];
  const lateBy = [];
  const sinceEarliest = [];
  const sorted = calls.slice().sort((a, b) => (a.startNs < b.startNs ? -1 : 1));
  for (const c of sorted) {
    const g = byJob.get(c.job);
    if (!g || ms(c.startNs) < ms(g.sendNs) + g.retryAfterMs - 1) {
      without += 1;
      continue;
    }
    lateness.push(ms(c.startNs) - (ms(g.recvNs) + g.retryAfterMs));
    sinceEarliest.push(ms(c.startNs) - (ms(g.sendNs) + g.retryAfterMs - 1));
    lateBy.push({ call: c, ms: lateness.at(-1) });
    asked.push(g);
  }
  // First come, first served: a job whose reservation was surely made first
  // (its reply came back before the other's request left) calls first.
  let outOfTurn = 0;
  for (let i = 0; i < asked.length; i++) {
    for (let j = i + 1; j < asked.length; j++) if (asked[j].recvNs < asked[i].sendNs) outOfTurn += 1;
  }
  const starts = sorted.map((c) => ms(c.startNs));
  const gaps = starts.slice(1).map((x, i) => x - starts[i]);
  const used = new Set(calls.map((c) => c.job));
  return {
    without,
    lateness,
    gaps,
    outOfTurn,
    lateBy,
    sinceEarliest,
    unused: grants.filter((g) => !used.has(g.job)).length + grants.length - byJob.size,
    spanMs: starts.at(-1) - starts[0],
  };
}

/** Count of pairs out of order (0 when `seq` is increasing). */
export function inversions(seq) {
  let n = 0;
  for (let i = 0; i < seq.length; i++) for (let j = i + 1; j < seq.length; j++) if (seq[i] > seq[j]) n++;
  return n;
}

/** min / mean / max of numbers, rounded to 0.1. */
export function summary(xs) {
  const r = (x) => Math.round(x * 10) / 10;
  if (xs.length === 0) return { min: NaN, mean: NaN, max: NaN };
  return { min: r(Math.min(...xs)), mean: r(xs.reduce((a, b) => a + b, 0) / xs.length), max: r(Math.max(...xs)) };
}

/** The median, rounded to 0.1. */
export function median(xs) {
  const s = xs.slice().sort((a, b) => a - b);
  return s.length ? Math.round(s[Math.floor(s.length / 2)] * 10) / 10 : NaN;
}
