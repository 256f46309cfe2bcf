// The hand-written .d.ts files cannot fall behind the code: every export of
// each entry point, and every public method, getter and static method of an
// exported class, has a declaration (tsc checks that the declarations are
// valid TypeScript and fit the libraries: test/types.ts, installed.test.js).

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';

const ENTRIES = [
  ['../src/index.js', '../src/index.d.ts'],
  ['../src/bullmq.js', '../src/bullmq.d.ts'],
];

/** The text of `export declare class name ... }` in `dts`, or null. */
function classBlock(dts, name) {
  const m = new RegExp(`^export declare class ${name}\\b[^\\n]*\\{\\n([\\s\\S]*?)^\\}`, 'm').exec(dts);
  return m ? m[1] : null;
}

/** Public members a class defines in code (prototype and static). */
function members(cls) {
  const out = [];
  for (const [owner, prefix] of [
    [cls.prototype, ''],
    [cls, 'static '],
  ]) {
    for (const name of Object.getOwnPropertyNames(owner)) {
      if (name.startsWith('_') || ['constructor', 'prototype', 'length', 'name'].includes(name)) continue;
      out.push([prefix, name]);
    }
  }
  return out;
}

for (const [js, dts] of ENTRIES) {
  test(`${dts.slice(3)} declares everything ${js.slice(3)} exports`, async () => {
    const mod = await import(js);
    const text = readFileSync(new URL(dts, import.meta.url), 'utf8');
    const missing = [];
    for (const [name, value] of Object.entries(mod)) {
      const kind = typeof value === 'function' ? (/^class\b/.test(value.toString()) ? 'class' : 'function') : 'const';
      if (!new RegExp(`^export declare ${kind} ${name}\\b`, 'm').test(text)) {
        missing.push(`${kind} ${name}`);
        continue;
      }
      if (kind !== 'class') continue;
      const block = classBlock(text, name);
      for (const [prefix, member] of members(value)) {
        if (!new RegExp(`^\\s*${prefix}(readonly |get )?${member}\\b\\??[(<:]`, 'm').test(block)) {
          missing.push(`${name}.${prefix}${member}`);
        }
      }
    }
    assert.deepEqual(missing, [], `declared nowhere in ${dts.slice(3)}`);
  });
}
