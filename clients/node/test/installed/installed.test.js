// The package as users get it, outside the repository (tools/installed.js):
// the `npm pack` tarball beside the newest bullmq, ioredis and node-redis;
// the same tarball beside node-redis 4 and ioredis 5; and a path install
// (`npm install /path/to/clients/node`, which npm links, so the package's
// own imports resolve from the checkout, where the user's libraries are
// not). In each: the BullMQ helper runs real workers, every Node snippet of
// the docs type-checks with `tsc --strict` against the installed types, and
// runs (the docs harness runs them in the packed project and checks what
// they print; here they run in the others too).
//
// TB_NODE_PROJECTS: the directory `make node-installed` filled; without it
// the projects are made afresh in a temporary directory.

import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { makeProjects } from '../../tools/installed.js';
import { REPO, Server } from '../helpers/server.js';

const PACKAGE = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const TSC = path.join(PACKAGE, 'node_modules', '.bin', 'tsc');

let projects;
let made = null;
before(() => {
  const dir = process.env.TB_NODE_PROJECTS;
  if (dir) {
    projects = Object.fromEntries(['packed', 'oldest', 'linked'].map((f) => [f, path.join(dir, f)]));
  } else {
    made = mkdtempSync(path.join(tmpdir(), 'tb-node-installed-'));
    projects = makeProjects(made);
  }
});
after(() => {
  if (made) rmSync(made, { recursive: true, force: true });
});

/** Every markdown file whose code blocks the docs harness runs. */
function docFiles() {
  const out = [path.join(REPO, 'README.md')];
  const walk = (dir) => {
    for (const name of readdirSync(dir)) {
      const p = path.join(dir, name);
      if (statSync(p).isDirectory()) walk(p);
      else if (name.endsWith('.md')) out.push(p);
    }
  };
  try {
    walk(path.join(REPO, 'docs'));
  } catch (e) {
    if (e.code !== 'ENOENT') throw e;
  }
  for (const top of ['clients', 'examples']) {
    for (const name of readdirSync(path.join(REPO, top))) {
      const readme = path.join(REPO, top, name, 'README.md');
      if (existsSync(readme)) out.push(readme);
    }
  }
  return out;
}

/** The Node snippets of the docs: { where, text, directive }. */
export function snippets() {
  const out = [];
  for (const file of docFiles()) {
    const lines = readFileSync(file, 'utf8').split('\n');
    for (let i = 0; i < lines.length; i++) {
      const open = /^(\s*)(```+)\s*(js|javascript|mjs|ts|typescript)\s*$/.exec(lines[i]);
      if (!open) continue;
      let j = i - 1;
      while (j >= 0 && lines[j].trim() === '') j--;
      const directive = j >= 0 && lines[j].includes('<!-- doctest:') ? lines[j] : '';
      const body = [];
      let k = i + 1;
      while (k < lines.length && !lines[k].startsWith(open[1] + open[2])) body.push(lines[k++]);
      out.push({ where: `${path.relative(REPO, file)}:${i + 1}`, text: body.join('\n') + '\n', directive });
      i = k;
    }
  }
  return out;
}

function run(cmd, args, options) {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { ...options, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    child.stdout.on('data', (d) => (out += d));
    child.stderr.on('data', (d) => (out += d));
    const timer = setTimeout(() => child.kill('SIGKILL'), 120_000);
    child.once('error', reject);
    child.once('close', (code) => {
      clearTimeout(timer);
      resolve({ code, out });
    });
  });
}

/** Runs `source` as a program of `project` against `server`; its output, or a failure. */
async function runIn(project, source, server) {
  const dir = mkdtempSync(path.join(project, 'run-'));
  try {
    writeFileSync(path.join(dir, 'main.mjs'), source.replace(/\b6379\b/g, String(server.port)));
    const { code, out } = await run(process.execPath, ['main.mjs'], { cwd: dir });
    assert.equal(code, 0, `the program failed in ${project}:\n${out}`);
    return out;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** What a project has installed, from its package.json. */
function has(project, name) {
  const pkg = JSON.parse(readFileSync(path.join(project, 'package.json'), 'utf8'));
  return name in (pkg.dependencies ?? {});
}

const usesBullmq = (s) => /from 'bullmq'|from 'tb-limiter\/bullmq'/.test(s.text);

// Per-tenant delays (DelayedError), a job that can never be served
// (UnrecoverableError) and the queue-wide backlog (the rate-limit error):
// each is an error BullMQ must recognise although this package does not
// import BullMQ.
const BULLMQ_PROGRAM = `
import { Queue, QueueEvents, Worker } from 'bullmq';
import { Redis } from 'ioredis';
import { createClient } from 'redis';
import { Limiter } from 'tb-limiter';
import { limitProcessor } from 'tb-limiter/bullmq';

const connection = new Redis('redis://127.0.0.1:6379', { maxRetriesPerRequest: null });
const nodeRedis = createClient({ url: 'redis://127.0.0.1:6379' });
await nodeRedis.connect();
const limiter = new Limiter(nodeRedis);
const queue = new Queue('q', { connection });
const events = new QueueEvents('q', { connection });
await events.waitUntilReady();
const started = Date.now();
const worker = new Worker(
  'q',
  limitProcessor((job) => limiter.bucket('t:' + job.data.t, '2', 1), async (job) => job.data.t + job.data.i, {
    cost: (job) => job.data.cost ?? 1,
    leadMs: 50,
  }),
  { connection, concurrency: 4 },
);
const jobs = await queue.addBulk([0, 1, 2].map((i) => ({ name: 'j', data: { t: 'a', i } })));
const out = [];
for (const job of jobs) out.push(await job.waitUntilFinished(events));
const elapsed = Date.now() - started;
const never = await queue.add('j', { t: 'b', i: 9, cost: 5 });
const failed = await never.waitUntilFinished(events).then(() => 'finished', (e) => e.message);
const state = await never.getState();
const attempts = (await queue.getJob(never.id)).attemptsMade;
console.log(JSON.stringify({ out, elapsed, failed, state, attempts }));
await Promise.all([worker.close(), queue.close(), events.close(), limiter.close()]);
await Promise.all([connection.quit(), nodeRedis.quit()]);
`;

for (const flavour of ['packed', 'linked']) {
  test(`${flavour}: the BullMQ helper uses the project's own BullMQ`, async () => {
    const server = await Server.start({ module: true });
    try {
      const printed = await runIn(projects[flavour], BULLMQ_PROGRAM, server);
      const r = JSON.parse(printed.trim().split('\n').pop());
      assert.deepEqual(r.out, ['a0', 'a1', 'a2']);
      // 2 tokens/s, burst 1: the third job's turn is 1 s after the first.
      assert.ok(r.elapsed >= 1000, `three jobs at 2/s took ${r.elapsed} ms`);
      assert.match(r.failed, /can never be had/);
      assert.equal(r.state, 'failed');
      assert.equal(r.attempts, 1, 'an UnrecoverableError is not retried');
    } finally {
      await server.stop();
    }
  });
}

test('oldest: node-redis 4 and ioredis 5 from the tarball', async () => {
  const server = await Server.start({ module: true });
  try {
    const printed = await runIn(
      projects.oldest,
      `
import { Redis } from 'ioredis';
import { createClient } from 'redis';
import { Limiter } from 'tb-limiter';
const a = createClient({ url: 'redis://127.0.0.1:6379' });
await a.connect();
const b = new Redis('redis://127.0.0.1:6379');
const versions = [(await import('redis/package.json', { with: { type: 'json' } })).default.version,
                  (await import('ioredis/package.json', { with: { type: 'json' } })).default.version];
const out = [];
for (const client of [a, b]) {
  const limiter = new Limiter(client);
  const bucket = limiter.bucket('k' + out.length, '1', 2);
  const r = await bucket.consume(2);
  await bucket.acquire(1, { block: true, timeoutMs: 5000 });
  out.push(r.allowed);
  await limiter.close();
}
console.log(JSON.stringify({ versions, out }));
await a.quit();
await b.quit();
`,
      server,
    );
    const r = JSON.parse(printed.trim().split('\n').pop());
    assert.match(r.versions[0], /^4\./);
    assert.match(r.versions[1], /^5\./);
    assert.deepEqual(r.out, [true, true]);
  } finally {
    await server.stop();
  }
});

describe('the docs Node snippets', () => {
  const all = snippets();
  test('there are some', () => assert.ok(all.length >= 3, `found ${all.length}`));

  for (const flavour of ['packed', 'linked', 'oldest']) {
    test(`${flavour}: type-check with tsc --strict against the installed types`, () => {
      const project = projects[flavour];
      const dir = path.join(project, 'ts-check');
      rmSync(dir, { recursive: true, force: true });
      mkdirSync(dir);
      const files = [];
      const chosen = all.filter((s) => has(project, 'bullmq') || !usesBullmq(s));
      chosen.forEach((s, i) => {
        const name = `snippet${i}.ts`;
        writeFileSync(path.join(dir, name), `// ${s.where}\n${s.text}export {};\n`);
        files.push(name);
      });
      writeFileSync(
        path.join(dir, 'tsconfig.json'),
        JSON.stringify({
          compilerOptions: {
            target: 'es2022',
            module: 'nodenext',
            moduleResolution: 'nodenext',
            strict: true,
            noEmit: true,
            skipLibCheck: true,
            types: ['node'],
            typeRoots: [path.join(PACKAGE, 'node_modules', '@types')],
          },
          files,
        }),
      );
      const r = spawnSync(TSC, ['-p', dir], { encoding: 'utf8' });
      const where = (line) => {
        const m = /snippet(\d+)\.ts/.exec(line);
        return m ? `${chosen[Number(m[1])].where}: ${line}` : line;
      };
      assert.equal(r.status, 0, `tsc --strict in ${project}:\n${(r.stdout + r.stderr).split('\n').map(where).join('\n')}`);
    });
  }

  for (const flavour of ['linked', 'oldest']) {
    test(`${flavour}: run`, async () => {
      const project = projects[flavour];
      for (const s of all) {
        if (!has(project, 'bullmq') && usesBullmq(s)) continue;
        if (/\buser=/.test(s.directive)) continue; // ACL users: the docs harness runs these (packed)
        const server = await Server.start({ module: !/server=lua/.test(s.directive) });
        try {
          await runIn(project, s.text, server).catch((e) => {
            throw new Error(`${s.where}: ${e.message}`);
          });
        } finally {
          await server.stop();
        }
      }
    });
  }
});
