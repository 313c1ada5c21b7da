// Builds a Metacontroller hook written for fission's Node.js environment (a CommonJS file,
// `module.exports = async function (context) {...}`), unchanged, into a component of the
// `wasmop:reconciler` `hook` world, with componentize-js, through its library API and absolute
// paths (as tools/build.mjs does for the `module` world).
//
//   node build-hook.mjs TOOLS_DIR WIT_DIR SDK_SRC HOOK_FILE OUT.wasm
//
// TOOLS_DIR holds the pinned tools (node_modules of tools/package-lock.json). The adapter
// (SDK_SRC/hook.js) and the hook's source, as a string, are staged into a temporary directory;
// an entry module exports `wasmop:reconciler/hooks` made by the adapter from that source (the
// hook file is evaluated as CommonJS when componentize-js snapshots the entry, so a hook that
// fails at its top level fails the build) and sends the hook's console to the host's `log`.
// Async hooks work: componentize-js runs the event loop until the promise `call` returns
// settles. The component gets WASI clocks and randomness and stdio, no wasi:http.
import { cp, mkdir, mkdtemp, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { basename, dirname, join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';

const [toolsDir, witDir, sdkSrc, hookFile, out] = process.argv.slice(2).map((a) => resolve(a));
if (!out) {
  console.error('usage: node build-hook.mjs TOOLS_DIR WIT_DIR SDK_SRC HOOK_FILE OUT.wasm');
  process.exit(2);
}
const tool = (path) => import(pathToFileURL(join(toolsDir, 'node_modules', path)).href);
const { componentize } = await tool('@bytecodealliance/componentize-js/src/componentize.js');
// componentize-js reads the WIT inside a WASI sandbox (preview2-shim), which since
// preview2-shim 0.26 preopens nothing by default: the staged WIT directory is preopened below.
const { _setPreopens } = await tool('@bytecodealliance/preview2-shim/dist/nodejs/filesystem.js');

/** The entry module: the `hooks` export, made by the adapter from the staged source. */
function entrySource(filename) {
  return [
    "import { log } from 'wasmop:reconciler/host@0.1.0';",
    "import { toHooks } from './wasmop-sdk/hook.js';",
    "import source from './source.js';",
    `export const hooks = toHooks(source, ${JSON.stringify(filename)}, log);`,
    '',
  ].join('\n');
}

/** Stages the adapter, the hook's source and the WIT in `stage`; returns the entry and WIT paths. */
async function stageHook(stage) {
  const source = await readFile(hookFile, 'utf8');
  await mkdir(join(stage, 'wasmop-sdk'));
  await cp(join(sdkSrc, 'hook.js'), join(stage, 'wasmop-sdk', 'hook.js'));
  await writeFile(join(stage, 'source.js'), `export default ${JSON.stringify(source)};\n`);
  const entry = join(stage, 'entry.js');
  await writeFile(entry, entrySource(basename(hookFile)));
  const stagedWit = join(stage, 'wit');
  await cp(witDir, stagedWit, { recursive: true });
  return { entry, stagedWit };
}

const started = Date.now();
const stage = await mkdtemp(join(tmpdir(), 'wasmop-js-hook-'));
try {
  const { entry, stagedWit } = await stageHook(stage);
  _setPreopens({ [stagedWit]: stagedWit });
  // The staged directory is what the component's module loader sees (componentize-js maps the
  // current directory when the source is inside it).
  process.chdir(stage);
  const { component } = await componentize({
    sourcePath: entry,
    witPath: stagedWit,
    worldName: 'hook',
    disableFeatures: ['http', 'fetch-event'],
  });
  await mkdir(dirname(out), { recursive: true });
  await writeFile(`${out}.tmp`, component);
  await rename(`${out}.tmp`, out);
  console.error(`js-module: built ${out} (${component.length} bytes) in ${((Date.now() - started) / 1000).toFixed(1)} s`);
} catch (e) {
  console.error(`js-module: building the hook ${hookFile} failed: ${e.message ?? e}`);
  process.exitCode = 1;
} finally {
  process.chdir(tmpdir());
  await rm(stage, { recursive: true, force: true });
}
