#!/usr/bin/env node
// Runs one JavaScript code block of the documentation as a user's program:
// the block becomes block.mjs (an ES module: top-level await works) in a
// scratch directory inside TB_NODE_PROJECT, a user's project where the
// package is installed as users install it (tools/installed.js makes them:
// the packed tarball or a path beside the newest bullmq, ioredis, redis),
// then `node block.mjs` runs there. Without TB_NODE_PROJECT the scratch
// directory links this package and its own node_modules instead. Its output goes to ours; its exit code
// is ours. The docs harness (tools/doctest, make test-docs) calls it for
// ```js blocks, after pointing redis://127.0.0.1:6379 at its own server.
//
//   node clients/node/tools/run-block.js BLOCK_FILE [TIMEOUT_MS]

import { spawn } from 'node:child_process';
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const PACKAGE = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

/** A scratch directory that can import what a user of the package has installed. */
export function scratchProject() {
  const project = process.env.TB_NODE_PROJECT;
  if (project) {
    if (!existsSync(path.join(project, 'node_modules', 'tb-limiter'))) {
      throw new Error(`TB_NODE_PROJECT=${project} has no node_modules/tb-limiter: make it with tools/installed.js`);
    }
    return mkdtempSync(path.join(project, 'block-'));
  }
  const dir = mkdtempSync(path.join(tmpdir(), 'tb-node-block-'));
  const modules = path.join(dir, 'node_modules');
  mkdirSync(modules);
  const installed = path.join(PACKAGE, 'node_modules');
  for (const name of readdirSync(installed)) {
    if (name.startsWith('.')) continue;
    symlinkSync(path.join(installed, name), path.join(modules, name));
  }
  symlinkSync(PACKAGE, path.join(modules, 'tb-limiter'));
  return dir;
}

/**
 * Runs `file` as block.mjs in a scratch project; resolves with its exit
 * code and what it printed (also passed through when `echo`).
 */
export function runBlock(file, { timeoutMs = 120_000, echo = false } = {}) {
  const dir = scratchProject();
  copyFileSync(file, path.join(dir, 'block.mjs'));
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ['block.mjs'], { cwd: dir, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => {
      stdout += d;
      if (echo) process.stdout.write(d);
    });
    child.stderr.on('data', (d) => {
      stderr += d;
      if (echo) process.stderr.write(d);
    });
    const timer = setTimeout(() => {
      stderr += `the block still ran after ${timeoutMs} ms: stopped\n`;
      child.kill('SIGKILL');
    }, timeoutMs);
    child.once('error', reject);
    child.once('close', (code, signal) => {
      clearTimeout(timer);
      rmSync(dir, { recursive: true, force: true });
      resolve({ code: code ?? (signal ? 1 : 0), stdout, stderr });
    });
  });
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const [file, timeout] = process.argv.slice(2);
  if (!file) {
    process.stderr.write('usage: node run-block.js BLOCK_FILE [TIMEOUT_MS]\n');
    process.exit(2);
  }
  const { code } = await runBlock(file, { timeoutMs: timeout ? Number(timeout) : undefined, echo: true });
  process.exit(code);
}
