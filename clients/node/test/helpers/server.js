// Real redis-server processes for the tests, as in the Rust and Python
// harnesses: a free loopback port, a start-up deadline, stopped by pid.
// REDIS_SERVER is the binary (default: redis-server on PATH), TB_MODULE the
// module (default: target/release/libtb.so at the repository root).

import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, renameSync, rmSync, statSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';

export const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../..');
const START_DEADLINE_MS = 15_000;
const STOP_DEADLINE_MS = 10_000;

/** The redis-server binary; fails clearly when there is none. */
export function serverBinary() {
  const name = process.env.REDIS_SERVER || 'redis-server';
  if (name.includes('/')) {
    if (!existsSync(name)) throw new Error(`REDIS_SERVER=${name} does not exist: run 'make test-node', which installs it`);
    return name;
  }
  const found = spawnSync('sh', ['-c', `command -v ${name}`], { encoding: 'utf8' }).stdout.trim();
  if (!found) throw new Error(`${name} not found on PATH: run 'make test-node', which installs it`);
  return found;
}

/** The tb module; fails clearly when it was not built. */
export function modulePath() {
  const p = path.resolve(process.env.TB_MODULE || path.join(REPO, 'target/release/libtb.so'));
  if (!existsSync(p)) throw new Error(`tb module not found at ${p}: run 'cargo build --release' first`);
  return p;
}

/**
 * The LD_PRELOAD clock shim (tests/clockshift/clockshift.c at the
 * repository root: the Rust and Python suites use it too), built with the C
 * compiler (CC or cc) into target/clockshift/ when missing or older than its
 * source. A server started with `env: clockshiftEnv(file)` takes its wall
 * clock from the control file (the format is in the C file).
 */
export function clockshiftLib() {
  const src = path.join(REPO, 'tests/clockshift/clockshift.c');
  const out = path.join(REPO, 'target/clockshift/libclockshift.so');
  if (!existsSync(out) || statSync(out).mtimeMs < statSync(src).mtimeMs) {
    mkdirSync(path.dirname(out), { recursive: true });
    const tmp = `${out}.${process.pid}`;
    const cc = process.env.CC || 'cc';
    const r = spawnSync(cc, ['-O2', '-shared', '-fPIC', '-Wall', '-Wextra', '-Werror', '-o', tmp, src, '-ldl'], {
      encoding: 'utf8',
    });
    if (r.status !== 0) throw new Error(`building ${src} with ${cc} failed:\n${r.stderr ?? r.error}`);
    renameSync(tmp, out);
  }
  return out;
}

/** Environment for a server whose wall clock `controlFile` controls. */
export function clockshiftEnv(controlFile) {
  return { LD_PRELOAD: clockshiftLib(), TB_CLOCK_FILE: controlFile };
}

/** A TCP port on 127.0.0.1 that is free right now. */
export function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

/** Sends one inline command and reads the first reply line (for readiness checks). */
function rawCommand(port, line, timeoutMs = 1000) {
  return new Promise((resolve, reject) => {
    const sock = net.connect({ host: '127.0.0.1', port });
    let data = '';
    const timer = setTimeout(() => {
      sock.destroy();
      reject(new Error('timeout'));
    }, timeoutMs);
    sock.on('connect', () => sock.write(`${line}\r\n`));
    sock.on('data', (d) => {
      data += d;
      if (data.includes('\r\n')) {
        clearTimeout(timer);
        sock.destroy();
        resolve(data.split('\r\n')[0]);
      }
    });
    sock.on('error', (e) => {
      clearTimeout(timer);
      reject(e);
    });
  });
}

/** A redis-server child on 127.0.0.1, with or without the module. */
export class Server {
  /**
   * @param {{module?: boolean, args?: string[], port?: number, env?: object}} options
   */
  static async start({ module = true, args = [], port, env } = {}) {
    const s = new Server();
    s.withModule = module;
    s.dir = mkdtempSync(path.join(tmpdir(), 'tb-node-'));
    s.port = port ?? (await freePort());
    const argv = [
      '--port', String(s.port),
      '--bind', '127.0.0.1',
      '--dir', s.dir,
      '--save', '',
      '--appendonly', 'no',
      '--logfile', 'redis.log',
    ];
    if (module) argv.push('--loadmodule', modulePath());
    argv.push(...args);
    s.proc = spawn(serverBinary(), argv, { cwd: s.dir, stdio: 'ignore', env: env ? { ...process.env, ...env } : undefined });
    s.exited = new Promise((resolve) => s.proc.once('exit', (code, signal) => resolve({ code, signal })));
    await s._waitReady();
    return s;
  }

  get url() {
    return `redis://127.0.0.1:${this.port}/0`;
  }

  logTail(lines = 30) {
    try {
      return readFileSync(path.join(this.dir, 'redis.log'), 'utf8').split('\n').slice(-lines).join('\n');
    } catch {
      return '(no log)';
    }
  }

  async _waitReady() {
    const deadline = Date.now() + START_DEADLINE_MS;
    while (Date.now() < deadline) {
      if (this.proc.exitCode !== null || this.proc.signalCode !== null) {
        throw new Error(`redis-server exited (${this.proc.exitCode ?? this.proc.signalCode}):\n${this.logTail()}`);
      }
      try {
        if ((await rawCommand(this.port, 'PING')) === '+PONG') return;
      } catch {
        // not listening yet
      }
      await sleep(50);
    }
    await this.stop();
    throw new Error(`redis-server did not answer PING within ${START_DEADLINE_MS} ms:\n${this.logTail()}`);
  }

  /** SIGTERM by pid, SIGKILL after the deadline; removes the data dir. */
  async stop() {
    if (this.proc.exitCode === null && this.proc.signalCode === null) {
      process.kill(this.proc.pid, 'SIGTERM');
      const timer = setTimeout(() => {
        if (this.proc.exitCode === null && this.proc.signalCode === null) process.kill(this.proc.pid, 'SIGKILL');
      }, STOP_DEADLINE_MS);
      await this.exited;
      clearTimeout(timer);
    }
    rmSync(this.dir, { recursive: true, force: true });
  }
}
