#!/usr/bin/env node
// The package's declarations (types/*.d.ts) are generated from the JSDoc of
// src/*.js by tsc (tsconfig.types.json) and committed, so that a change of
// the public types shows in review. This script writes them, or checks that
// the committed ones are what tsc generates now.
//
//   node tools/types.js          regenerate types/   (npm run build:types)
//   node tools/types.js --check  fail, naming the files, if types/ is stale
//                                (npm run check:types, make check-node-types,
//                                npm pack's prepack)

import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const PACKAGE = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const TYPES = path.join(PACKAGE, 'types');
const TSC = path.join(PACKAGE, 'node_modules', '.bin', 'tsc');

/** Runs tsc -p tsconfig.types.json with its output in `outDir`. */
function emit(outDir) {
  if (!existsSync(TSC)) throw new Error(`${TSC} is missing: run npm ci in ${PACKAGE}`);
  execFileSync(TSC, ['-p', path.join(PACKAGE, 'tsconfig.types.json'), '--outDir', outDir], {
    cwd: PACKAGE,
    stdio: ['ignore', 'inherit', 'inherit'],
  });
}

/** The .d.ts files of `dir` by name (an empty map when it does not exist). */
function files(dir) {
  if (!existsSync(dir)) return new Map();
  return new Map(readdirSync(dir).filter((f) => f.endsWith('.d.ts')).map((f) => [f, readFileSync(path.join(dir, f), 'utf8')]));
}

/** The names of the files of types/ that differ from what tsc generates now (missing, extra or changed). */
export function staleTypes() {
  const scratch = mkdtempSync(path.join(tmpdir(), 'tb-node-types-'));
  try {
    emit(scratch);
    const want = files(scratch);
    const have = files(TYPES);
    const names = [...new Set([...want.keys(), ...have.keys()])].sort();
    return names.filter((f) => want.get(f) !== have.get(f)).map((f) => path.join('types', f));
  } finally {
    rmSync(scratch, { recursive: true, force: true });
  }
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  if (process.argv.includes('--check')) {
    const stale = staleTypes();
    if (stale.length > 0) {
      process.stderr.write(
        `error: the declarations are stale (not what tsc generates from src/): ${stale.join(', ')}\n` +
          `  run 'npm run build:types' in ${PACKAGE} (or 'make node-types') and commit types/\n`,
      );
      process.exit(1);
    }
    process.stdout.write('node types: types/ is what tsc generates from src/\n');
  } else {
    rmSync(TYPES, { recursive: true, force: true });
    emit(TYPES);
  }
}
