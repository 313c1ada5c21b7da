// The hook adapter as a real component: `scripts/js-module.sh hook` builds the fission-style
// tests/hooks/probe.js into a component of the `hook` world (~12 s; skipped when its inputs are
// unchanged), jco transpiles it and node instantiates it with the host's `log` and WASI shims
// that grant nothing, and `call` answers each way a hook can.
//
// The component is kept in WASMOP_HOOK_TEST_DIR (default: $TMPDIR/wasmop-hook-test-$UID) so
// later runs skip the build; the transpiled files go to a temporary directory, removed after.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { after, before, test } from 'node:test';
import { fileURLToPath, pathToFileURL } from 'node:url';

const ROOT = fileURLToPath(new URL('../../../', import.meta.url));
const SCRIPT = join(ROOT, 'scripts/js-module.sh');
const OUT_DIR = process.env.WASMOP_HOOK_TEST_DIR ?? join(tmpdir(), `wasmop-hook-test-${process.getuid?.() ?? 'user'}`);

const script = (...args) => execFileSync('bash', [SCRIPT, ...args], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] });

let transpiled;
let hooks;
const logs = [];

/** Builds the probe (or finds it up to date) and returns the component's bytes. */
function buildProbe() {
  const wasm = join(OUT_DIR, 'probe.wasm');
  script('hook', join(ROOT, 'guest-sdk/js/tests/hooks/probe.js'), wasm);
  return readFile(wasm);
}

/** jco's transpiled files of `component`, written into a new temporary directory. */
async function transpile(tools, component) {
  const { transpile: jco } = await import(pathToFileURL(join(tools, 'node_modules/@bytecodealliance/jco/dist/api.js')).href);
  const { files } = await jco(component, { name: 'probe', instantiation: { tag: 'async' } });
  const dir = await mkdtemp(join(tmpdir(), 'wasmop-hook-jco-'));
  for (const [name, bytes] of Object.entries(files)) {
    await mkdir(dirname(join(dir, name)), { recursive: true });
    await writeFile(join(dir, name), bytes);
  }
  return dir;
}

/** The component's `hooks` export, instantiated with a log that collects and WASI that grants nothing. */
async function instantiate(tools, dir) {
  const shim = await import(pathToFileURL(join(tools, 'node_modules/@bytecodealliance/preview2-shim/dist/common/instantiation.js')).href);
  const wasi = new shim.WASIShim({ sandbox: { preopens: {}, env: {}, enableNetwork: false } }).getImportObject();
  const { instantiate: run } = await import(pathToFileURL(join(dir, 'probe.js')).href);
  const host = { log: (level, line) => logs.push([level, line]) };
  const core = async (name) => WebAssembly.compile(await readFile(join(dir, name)));
  return (await run(core, { ...wasi, 'wasmop:reconciler/host': host })).hooks;
}

before(async () => {
  const tools = script('tools').trim().split('\n').at(-1);
  transpiled = await transpile(tools, await buildProbe());
  hooks = await instantiate(tools, transpiled);
});

after(() => transpiled && rm(transpiled, { recursive: true, force: true }));

/** `call` for a parent in `mode`; jco returns `ok`'s string and throws `err`'s payload. */
function call(mode, { kind = 'sync', path = '/sync', finalizing = false } = {}) {
  logs.length = 0;
  const parent = { metadata: { name: 'p' }, spec: { mode, replicas: 2 } };
  const body = JSON.stringify({ parent, children: { 'ConfigMap.v1': { 'p-0': {} } }, finalizing });
  try {
    return { ok: JSON.parse(hooks.call({ kind, path, body })) };
  } catch (e) {
    if (e.payload === undefined) throw e;
    return { err: e.payload };
  }
}

test('a sync call answers the desired children, after an await, and logs to the host', () => {
  const { ok } = call('children');
  assert.deepEqual(ok.children.map((c) => c.metadata.name), ['p-0', 'p-1']);
  assert.deepEqual(ok.status, { seen: 1, path: '/sync', finalizing: false });
  assert.deepEqual(logs, [['info', 'hook POST /sync for p']]);
  assert.deepEqual(call('children', { kind: 'finalize', path: '', finalizing: true }).ok.status, { seen: 1, path: '/finalize', finalizing: true });
});

test('statuses, throws and refused requires cross as the hook-error', () => {
  assert.deepEqual(call('fail'), { err: { status: 503, message: '{"reason":"busy"}' } });
  const thrown = call('throw').err;
  assert.equal(thrown.status, 500);
  // Its type and where, not its text (which may carry values); the log has SpiderMonkey's frames.
  assert.equal(thrown.message, 'RangeError at probe.js:26 (its text is not shown, it may carry values: answer {status, body} to say more)');
  assert.deepEqual(logs, [['error', 'RangeError (its text is not shown, it may carry values: answer {status, body} to say more)\nmodule.exports@probe.js:26:13']]);
  assert.match(call('require').err.message, /^Error: probe\.js: require\("https"\) is not available/);
});

test('a string body crosses as it is; the console and the body are bounded', () => {
  assert.deepEqual(call('text'), { ok: { children: [] } });
  call('chatty');
  assert.equal(logs.length, 257);
  assert.deepEqual(logs.at(-1), ['warn', "console: 45 lines over the hook's 256 per call were dropped"]);
  assert.match(call('huge').err.message, /^the hook's body is 5242891 bytes, over the 4194304/);
});
