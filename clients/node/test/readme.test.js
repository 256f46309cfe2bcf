// The README's JavaScript blocks run as a user would run them: each block is
// a program (tools/run-block.js: an ES module in a scratch project where
// tb-limiter, redis, ioredis and bullmq are installed) against a server the
// test starts, with redis://127.0.0.1:6379 pointed at it; a block marked
// `<!-- doctest: output -->` right after one is exactly what it prints.
// (The docs harness of make test-docs uses the same runner for js blocks.)

import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';

import Redis from 'ioredis';

import { runBlock } from '../tools/run-block.js';
import { REPO, Server } from './helpers/server.js';

/** Fenced blocks of a Markdown file, with the doctest directive before each. */
export function fencedBlocks(text) {
  const lines = text.split('\n');
  const blocks = [];
  let directive = '';
  for (let i = 0; i < lines.length; i++) {
    const open = /^(\s*)(`{3,})(\S*)\s*$/.exec(lines[i]);
    if (!open) {
      const d = /^\s*<!--\s*doctest:(.*?)-->\s*$/.exec(lines[i]);
      if (d) directive = d[1].trim();
      else if (lines[i].trim() !== '') directive = '';
      continue;
    }
    const [, indent, fence, lang] = open;
    const body = [];
    let j = i + 1;
    for (; j < lines.length && !(lines[j].startsWith(indent + fence) && lines[j].trim() === fence); j++) {
      body.push(lines[j].startsWith(indent) ? lines[j].slice(indent.length) : lines[j]);
    }
    blocks.push({ line: i + 1, lang, text: body.join('\n') + '\n', words: directive.split(/\s+/).filter(Boolean) });
    directive = '';
    i = j;
  }
  return blocks;
}

const blocks = fencedBlocks(readFileSync(path.join(REPO, 'README.md'), 'utf8'));
const js = blocks
  .map((b, i) => ({ ...b, output: blocks[i + 1]?.words.includes('output') ? blocks[i + 1] : null }))
  .filter((b) => b.lang === 'js' || b.lang === 'javascript');

const servers = {};
let scratch;
before(async () => {
  servers.module = await Server.start({ module: true });
  servers.lua = await Server.start({ module: false });
  scratch = mkdtempSync(path.join(tmpdir(), 'tb-readme-'));
});
after(async () => {
  for (const s of Object.values(servers)) await s.stop();
  rmSync(scratch, { recursive: true, force: true });
});

test('the README has JavaScript blocks', () => {
  assert.ok(js.length >= 3, `${js.length} js blocks`);
});

for (const block of js) {
  test(`README.md:${block.line} runs${block.output ? ', printing what the README shows' : ''}`, async () => {
    const server = block.words.includes('server=lua') ? servers.lua : servers.module;
    const admin = new Redis(server.port, '127.0.0.1');
    await admin.flushall();
    await admin.quit();
    const file = path.join(scratch, `block-${block.line}.mjs`);
    writeFileSync(file, block.text.replace(/\b6379\b/g, String(server.port)));
    const { code, stdout, stderr } = await runBlock(file, { timeoutMs: 60_000 });
    assert.equal(code, 0, `the block exited with ${code}:\n${stdout}\n${stderr}`);
    assert.equal(stderr, '', 'the block printed to stderr');
    if (block.output) {
      const lines = (s) => s.trimEnd().split('\n').map((l) => l.trimEnd());
      assert.deepEqual(lines(stdout), lines(block.output.text), `README.md:${block.output.line}`);
    }
  });
}
