// The Metacontroller hook adapter, natively: fission-style hooks (tests/hooks/*.js) evaluated as
// CommonJS and called with the WIT `hook-request` shapes componentize-js gives the export
// (records with camelCase fields, enums by their WIT names, a `result` as {tag: 'ok' | 'err'}).
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';

import { MAX_BODY_BYTES, MAX_LOG_LINE_CHARS, MAX_LOG_LINES, MAX_MESSAGE_CHARS, answer, cut, toHooks } from '../src/hook.js';

const PARENT = { apiVersion: 'example.com/v1', kind: 'Thing', metadata: { name: 'p', namespace: 'n' }, spec: { replicas: 2, message: 'hi' } };
const syncRequest = (parent = PARENT, path = '/sync') => ({
  kind: 'sync',
  path,
  body: JSON.stringify({ controller: {}, parent, children: { 'ConfigMap.v1': { 'p-0': {} } }, related: {}, finalizing: false }),
});

/** The sample hook `name` (tests/hooks/NAME.js) as the component exports it, and its log lines. */
function load(name) {
  const source = readFileSync(new URL(`./hooks/${name}.js`, import.meta.url), 'utf8');
  return fromSource(source, `${name}.js`);
}

function fromSource(source, filename = 'hook.js') {
  const logs = [];
  return { hooks: toHooks(source, filename, (level, line) => logs.push([level, line])), logs };
}

test('a sync hook builds children from the parent; its console goes to the host log', async () => {
  const { hooks, logs } = load('children');
  const out = await hooks.call(syncRequest());
  assert.equal(out.tag, 'ok');
  const desired = JSON.parse(out.val);
  assert.deepEqual(desired.children.map((c) => [c.kind, c.metadata.name, c.data.message]), [
    ['ConfigMap', 'p-0', 'hi'],
    ['ConfigMap', 'p-1', 'hi'],
  ]);
  assert.deepEqual(desired.status, { configMaps: 1 });
  assert.deepEqual(logs, [['info', 'sync p {"replicas":2,"seen":1}']]);
});

test('a status other than 2xx is the hook-error with that status and the body as text', async () => {
  assert.deepEqual(await load('status500').hooks.call(syncRequest()), { tag: 'err', val: { status: 500, message: 'no quota for p' } });
});

test('a thrown error is the hook-error 500 with its type and where; the log has the hook file frames of its stack', async () => {
  const { hooks, logs } = load('throws');
  const out = await hooks.call(syncRequest({ ...PARENT, spec: undefined }));
  assert.equal(out.tag, 'err');
  assert.equal(out.val.status, 500);
  assert.equal(out.val.message, 'TypeError at throws.js:3 (its text is not shown, it may carry values: answer {status, body} to say more)');
  assert.equal(logs.length, 1);
  assert.equal(logs[0][0], 'error');
  assert.match(logs[0][1], /^TypeError \(its text is not shown[^\n]*\n\s+at check \(throws\.js:3:\d+\)\n\s+at module\.exports \(throws\.js:7:\d+\)$/);
  assert.doesNotMatch(logs[0][1], /callHook|hook\.js:|no spec/);
});

const MARKER = 's3cr3t-Pa55w0rd'; // a Secret's value a hook formats into what it throws

test("what a hook throws reaches neither the answer nor the log with its text, only its type and frames", async () => {
  const { hooks, logs } = fromSource(`function check(pw) {
  if (pw !== 'hunter2') throw new Error('bad password ' + pw + '\\n    at fake (' + pw + '.js:1:1)');
}
module.exports = async function (context) {
  var pw = context.request.body.password;
  if (context.request.path === '/string') throw 'bad password ' + pw;
  if (context.request.path === '/json') return { body: { toJSON: function () { throw new RangeError(pw); } } };
  check(pw);
};`, 'leaky.js');
  const call = (path) => hooks.call({ kind: 'sync', path, body: JSON.stringify({ password: MARKER }) });
  const thrown = await call('/sync');
  assert.equal(thrown.val.status, 500);
  assert.match(thrown.val.message, /^Error at leaky\.js:2 \(its text is not shown/);
  const string = await call('/string');
  assert.match(string.val.message, /^a thrown string \(its text is not shown/);
  const json = await call('/json');
  assert.match(json.val.message, /^the hook's body cannot be written as JSON \([^)]*\): RangeError at leaky\.js:7 \(its text/);
  for (const out of [thrown, string, json]) assert.ok(!out.val.message.includes(MARKER), out.val.message);
  assert.ok(logs.length > 0 && !logs.some(([, line]) => line.includes(MARKER)), JSON.stringify(logs));
  // The log keeps the hook's frames, at error.
  assert.ok(logs.some(([level, line]) => level === 'error' && /^Error \(its text is not shown[^\n]*\n.*\bcheck\b.*leaky\.js:2:/s.test(line)), JSON.stringify(logs));
});

test('a string body is passed as it is', async () => {
  assert.deepEqual(await load('text').hooks.call(syncRequest()), { tag: 'ok', val: '{"status":{"name":"p"},"children":[]}' });
});

test('an async hook is awaited', async () => {
  const out = await load('async').hooks.call(syncRequest());
  assert.deepEqual(JSON.parse(out.val), { status: { phase: 'Running', path: 'awaited' }, children: [] });
});

test("the context is fission's request of a POST of the document to the hook's path", async () => {
  const { hooks } = fromSource(`module.exports = async function (context) {
    var r = context.request;
    return { body: { method: r.method, url: r.url, path: r.path, type: r.headers['content-type'], get: r.get('Content-Type'), finalizing: r.body.finalizing } };
  };`);
  const seen = async (path, kind = 'finalize') => JSON.parse((await hooks.call({ ...syncRequest(PARENT, path), kind })).val);
  assert.deepEqual(await seen('/finalize'), { method: 'POST', url: '/finalize', path: '/finalize', type: 'application/json', get: 'application/json', finalizing: false });
  // No path: `/<kind>`, as Metacontroller's default.
  assert.equal((await seen('', 'customize')).path, '/customize');
  // A body that is not JSON: 400, as a JSON body parser answers.
  const bad = await hooks.call({ kind: 'sync', path: '/sync', body: '{' });
  assert.equal(bad.val.status, 400);
  assert.match(bad.val.message, /^the sync request's body is not JSON: \S/);
});

test('answers: no status is 200, other statuses and bodies as text, and what is not an answer', () => {
  assert.deepEqual(answer({ body: { a: 1 } }), { tag: 'ok', val: '{"a":1}' });
  assert.deepEqual(answer({ status: 204 }), { tag: 'ok', val: '' });
  assert.deepEqual(answer({ status: 404, body: { error: 'gone' } }), { tag: 'err', val: { status: 404, message: '{"error":"gone"}' } });
  assert.deepEqual(answer({ status: 302, body: 'elsewhere' }), { tag: 'err', val: { status: 302, message: 'elsewhere' } });
  assert.deepEqual(answer(undefined), { tag: 'err', val: { status: 500, message: 'the hook answered undefined, not {status, body}' } });
  assert.deepEqual(answer('ok'), { tag: 'err', val: { status: 500, message: 'the hook answered a string, not {status, body}' } });
  assert.match(answer({ status: 'fine' }).val.message, /status fine, not an HTTP status/);
  assert.match(answer({ status: 700 }).val.message, /status 700, not an HTTP status/);
  const cyclic = {};
  cyclic.self = cyclic;
  assert.match(answer({ status: 200, body: cyclic }).val.message, /^the hook's body cannot be written as JSON \(a cycle, a BigInt, a toJSON that throws\): TypeError \(its text/);
  assert.match(answer({ status: 200, body: { big: 1n } }).val.message, /cannot be written as JSON/);
});

test('answers are bounded: a body over MAX_BODY_BYTES is refused, a message is cut', () => {
  const at = 'x'.repeat(MAX_BODY_BYTES);
  assert.equal(answer({ body: at }).tag, 'ok');
  // Multi-byte characters count as their UTF-8 bytes.
  const wide = 'é'.repeat(MAX_BODY_BYTES / 2 + 1);
  const over = answer({ body: wide });
  assert.equal(over.val.status, 500);
  assert.match(over.val.message, new RegExp(`body is ${MAX_BODY_BYTES + 2} bytes, over the ${MAX_BODY_BYTES} .*MAX_BODY_BYTES, guest-sdk/js/src/hook\\.js`));
  const long = answer({ status: 500, body: 'y'.repeat(MAX_MESSAGE_CHARS + 10) }).val.message;
  assert.ok(long.startsWith('y'.repeat(MAX_MESSAGE_CHARS)));
  assert.ok(long.endsWith('... (10 more characters)'));
  // Never between the halves of a surrogate pair.
  assert.equal(cut('ab😀', 3), 'ab... (2 more characters)');
});

test('the console is bounded per call: line length and count, then one line says how many were dropped', async () => {
  const { hooks, logs } = fromSource(`module.exports = async function (context) {
    console.warn('long', 'z'.repeat(${MAX_LOG_LINE_CHARS}));
    console.error(new RangeError('bad'));
    for (var i = 0; i < ${MAX_LOG_LINES + 8}; i++) console.debug('line', i);
    return { body: {} };
  };`);
  await hooks.call(syncRequest());
  assert.equal(logs.length, MAX_LOG_LINES + 1);
  assert.equal(logs[0][0], 'warn');
  assert.ok(logs[0][1].endsWith('... (5 more characters)'));
  assert.equal(logs[0][1].length, MAX_LOG_LINE_CHARS + '... (5 more characters)'.length);
  assert.match(logs[1][1], /^RangeError: bad\n/);
  assert.deepEqual(logs.at(-2), ['debug', `line ${MAX_LOG_LINES - 3}`]);
  assert.deepEqual(logs.at(-1), ['warn', `console: 10 lines over the hook's ${MAX_LOG_LINES} per call were dropped`]);
  // The next call has a fresh budget.
  logs.length = 0;
  await hooks.call(syncRequest());
  assert.equal(logs.length, MAX_LOG_LINES + 1);
});

test('require refuses every module: at the top level the load fails, in a call the call fails', async () => {
  assert.throws(() => fromSource("const fs = require('fs');\nmodule.exports = async () => ({});", 'top.js'), {
    message: /^top\.js: require\("fs"\) is not available: a hook runs in a Wasm sandbox/,
  });
  const { hooks } = fromSource("module.exports = async function () { require('lodash'); };", 'lazy.js');
  const out = await hooks.call(syncRequest());
  assert.equal(out.val.status, 500);
  assert.match(out.val.message, /^Error: lazy\.js: require\("lodash"\) is not available/);
});

test('the file is CommonJS: sloppy mode, `this` is exports, exports must be a function', async () => {
  // An undeclared assignment works in a CommonJS file (sloppy mode), not in an ES module.
  const { hooks } = fromSource("counter = 0;\nvar top = this === exports;\nmodule.exports = async function () { counter++; return { body: { counter: counter, topIsExports: top } }; };");
  assert.deepEqual(JSON.parse((await hooks.call(syncRequest())).val), { counter: 1, topIsExports: true });
  delete globalThis.counter;
  assert.throws(() => fromSource('export default async function () {}', 'esm.js'), {
    name: 'SyntaxError',
    message: /^esm\.js is not a CommonJS script: .*module\.exports = async function \(context\)/,
  });
  assert.throws(() => fromSource('exports.sync = async function () {};', 'named.js'), {
    message: /^named\.js exports an object, not a function/,
  });
  // A hashbang line is allowed, as Node allows it.
  assert.equal((await fromSource('#!/usr/bin/env node\nmodule.exports = async () => ({ body: [] });').hooks.call(syncRequest())).val, '[]');
});
