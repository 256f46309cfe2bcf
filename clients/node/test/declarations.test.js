// The shipped declarations (types/) are generated from the JSDoc of src/
// by tsc (tools/types.js): they must be what tsc generates now, and no
// `any` may leak into them but a BullMQ job's data (test/types.ts checks
// what they accept and refuse; the installed-package test checks them as
// users get them).

import assert from 'node:assert/strict';
import { readFileSync, readdirSync } from 'node:fs';
import { test } from 'node:test';

import { staleTypes } from '../tools/types.js';

const TYPES = new URL('../types/', import.meta.url);

test('types/ is what tsc generates from src/ (npm run build:types)', () => {
  assert.deepEqual(staleTypes(), [], "stale: run 'npm run build:types' and commit types/");
});

/**
 * The one `any` allowed: a BullMQ job's data, as BullMQ types it when the
 * job's type is not given (src/bullmq.js, JobLike).
 */
const ALLOWED_ANY = new Set(['types/bullmq.d.ts: data: any;']);

/** Each line of code of the declarations (comments left out), as `types/file: line`. */
function declarationLines() {
  const out = [];
  for (const name of readdirSync(TYPES).filter((f) => f.endsWith('.d.ts'))) {
    // Without the comments, whose prose may say "any".
    const code = readFileSync(new URL(name, TYPES), 'utf8')
      .replace(/\/\*[\s\S]*?\*\//g, '')
      .replace(/\/\/.*$/gm, '');
    for (const line of code.split('\n')) out.push({ line, where: `types/${name}: ${line.trim()}` });
  }
  return out;
}

test('no declaration is typed any, but a job\'s data', () => {
  const found = declarationLines().filter(({ line, where }) => /\bany\b/.test(line) && !ALLOWED_ANY.has(where));
  assert.deepEqual(found.map((f) => f.where), []);
});

test('no internal member is declared (mark it @internal, as a class field or method)', () => {
  // node-redis's own field, in the shape the adapter uses of its client.
  const allowed = new Set(['types/connection.d.ts: _keyPrefix?: string | Buffer;']);
  const found = declarationLines().filter(({ line, where }) => /^\s+(readonly\s+)?_\w+\??[(:<;]/.test(line) && !allowed.has(where));
  assert.deepEqual(found.map((f) => f.where), []);
});

test('every export of each entry point is declared', async () => {
  for (const [js, dts] of [
    ['../src/index.js', 'index.d.ts'],
    ['../src/bullmq.js', 'bullmq.d.ts'],
  ]) {
    const text = readFileSync(new URL(dts, TYPES), 'utf8');
    const missing = Object.keys(await import(js)).filter(
      (name) => !new RegExp(`^export (declare (const|class|function) ${name}\\b|\\{[^}]*\\b${name}\\b[^}]*\\})`, 'm').test(text),
    );
    assert.deepEqual(missing, [], `declared nowhere in types/${dts}`);
  }
});
