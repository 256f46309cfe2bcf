#!/usr/bin/env node
// Installs tb-limiter the ways users get it, into fresh projects outside the
// repository, and prints their directories (one a line):
//
//   packed  `npm pack`, the tarball installed beside the newest bullmq,
//           ioredis and node-redis (redis);
//   oldest  the same tarball beside the oldest majors the package allows
//           where behaviour differs: node-redis 4 and ioredis 5 (no BullMQ:
//           BullMQ 6 wants node-redis 5 or later in the same project);
//   linked  `npm install /path/to/checkout/clients/node` (npm links it: the
//           package's own imports resolve from the checkout, not from the
//           project). The checkout is the tarball's files unpacked (a fresh
//           clone has no node_modules there; this one's has the dev
//           dependencies, which would hide the failure).
//
// Each project holds the packages a user would install and nothing of this
// repository's node_modules. The tests (test/installed/installed.test.js) and the docs
// harness (run-block.js with TB_NODE_PROJECT) run programs inside them.
//
//   node clients/node/tools/installed.js DIR

import { execFileSync } from 'node:child_process';
import { mkdirSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const PACKAGE = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

/** What each project installs besides tb-limiter (npm specs). */
export const FLAVOURS = {
  packed: ['bullmq@latest', 'ioredis@latest', 'redis@latest'],
  oldest: ['ioredis@5', 'redis@4'],
  linked: ['bullmq@latest', 'ioredis@latest', 'redis@latest'],
};

function npm(args, cwd) {
  execFileSync('npm', [...args, '--no-audit', '--no-fund', '--loglevel=error'], { cwd, stdio: ['ignore', 'ignore', 'inherit'] });
}

/** Makes the projects under `dir` (afresh) and returns their directories by flavour. */
export function makeProjects(dir) {
  if (dir.startsWith(path.dirname(path.dirname(PACKAGE)) + path.sep)) {
    throw new Error(`${dir} is inside the repository: a user's project is not`);
  }
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(dir, { recursive: true });
  execFileSync('npm', ['pack', '--pack-destination', dir, '--loglevel=error'], { cwd: PACKAGE, stdio: ['ignore', 'ignore', 'inherit'] });
  const tarball = path.join(dir, readdirSync(dir).find((f) => f.endsWith('.tgz')));
  const checkout = path.join(dir, 'checkout');
  mkdirSync(checkout);
  execFileSync('tar', ['-xzf', tarball, '-C', checkout]);
  const out = {};
  for (const [flavour, deps] of Object.entries(FLAVOURS)) {
    const project = path.join(dir, flavour);
    mkdirSync(project);
    writeFileSync(
      path.join(project, 'package.json'),
      JSON.stringify({ name: `tb-user-${flavour}`, version: '1.0.0', private: true, type: 'module' }, null, 2),
    );
    npm(['install', flavour === 'linked' ? path.join(checkout, 'package') : tarball, ...deps], project);
    out[flavour] = project;
  }
  return out;
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const [dir] = process.argv.slice(2);
  if (!dir) {
    process.stderr.write('usage: node installed.js DIR\n');
    process.exit(2);
  }
  for (const project of Object.values(makeProjects(path.resolve(dir)))) process.stdout.write(`${project}\n`);
}
