// Builds a JavaScript reconciler into a wasmop module (a component of the `wasmop:reconciler`
// world) with componentize-js, through its library API and absolute paths (its CLI resolves
// relative paths inside its own WASI sandbox and fails).
//
//   node build.mjs TOOLS_DIR WIT_DIR SDK_SRC APP_DIR APP_NAME OUT.wasm
//
// TOOLS_DIR holds the pinned tools (node_modules of tools/package-lock.json). The app's module
// graph (APP_DIR/APP_NAME.js and the files it imports relatively, within APP_DIR) and the SDK
// (SDK_SRC, without its Node-only files) are staged into a temporary directory; imports
// of `wasmop-sdk` become relative imports of the staged SDK; an entry module exports
// `wasmop:reconciler/guest` made from the app's default export (the reconciler) and sends the
// SDK's log lines to the host's `log`. The component gets WASI clocks and randomness (so
// `Date.now()` and `Math.random()` follow the host's sandbox policy) and stdio (for uncaught
// errors); no wasi:http (the host links none).
import { cp, mkdir, mkdtemp, readdir, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join, relative, resolve, sep } from 'node:path';
import { pathToFileURL } from 'node:url';

const [toolsDir, witDir, sdkSrc, appDir, appName, out] = process.argv.slice(2).map((a, i) => (i === 4 ? a : resolve(a)));
if (!out) {
  console.error('usage: node build.mjs TOOLS_DIR WIT_DIR SDK_SRC APP_DIR APP_NAME OUT.wasm');
  process.exit(2);
}
const tool = (path) => import(pathToFileURL(join(toolsDir, 'node_modules', path)).href);
const { componentize } = await tool('@bytecodealliance/componentize-js/src/componentize.js');
// componentize-js's own parser of import statements (pinned with it).
const lexer = await tool('es-module-lexer/dist/lexer.js');
await lexer.init;
// componentize-js reads the WIT inside a WASI sandbox (preview2-shim), which since
// preview2-shim 0.26 preopens nothing by default: the staged WIT directory is preopened below.
const { _setPreopens } = await tool('@bytecodealliance/preview2-shim/dist/nodejs/filesystem.js');

/** The SDK files that need Node (the test harness, the resolve hook): never in a component. */
const NODE_ONLY = new Set(['testing.js', 'register.js', 'resolve.js']);
/** `text` with its `wasmop-sdk[/name]` imports pointing at the staged SDK from `file`. */
function rewrite(text, file, stagedSdk, shown, relatives, needsDefault = false) {
  const [imports, exports] = lexer.parse(text, shown);
  if (needsDefault && !exports.some((e) => e.n === 'default')) {
    throw new Error(`${shown} has no default export: export the reconciler, \`export default { metadata() {...}, reconcile(request) {...} }\``);
  }
  let result = '';
  let last = 0;
  for (const imp of imports) {
    const specifier = imp.n;
    if (specifier === undefined || imp.s < 0) continue;
    let target;
    if (specifier === 'wasmop-sdk') target = 'index.js';
    else if (specifier.startsWith('wasmop-sdk/')) target = `${specifier.slice('wasmop-sdk/'.length)}.js`;
    else if (specifier.startsWith('./') || specifier.startsWith('../')) {
      relatives.push(specifier);
      continue;
    } else if (specifier.startsWith('wasmop:') || specifier.startsWith('wasi:')) continue;
    else throw new Error(`${shown} imports ${JSON.stringify(specifier)}: a module may import its own files (./...) and wasmop-sdk only (no npm packages, no node: modules)`);
    if (imp.d > -1) throw new Error(`${shown} imports ${specifier} dynamically: import it statically`);
    if (NODE_ONLY.has(target)) throw new Error(`${shown} imports ${specifier}, which needs Node: import it from tests only`);
    let path = relative(dirname(file), join(stagedSdk, target)).split(sep).join('/');
    if (!path.startsWith('.')) path = `./${path}`;
    result += text.slice(last, imp.s) + path;
    last = imp.e;
  }
  return result + text.slice(last);
}

const started = Date.now();
const stage = await mkdtemp(join(tmpdir(), 'wasmop-js-'));
try {
  const stagedSdk = join(stage, 'wasmop-sdk');
  const stagedApp = join(stage, 'app');
  await mkdir(stagedSdk);
  for (const file of await readdir(sdkSrc)) {
    if (file.endsWith('.js') && !NODE_ONLY.has(file)) await cp(join(sdkSrc, file), join(stagedSdk, file));
  }
  // The app's module graph: the app file and the files it imports, relatively, transitively.
  const pending = [`${appName}.js`];
  const staged = new Set();
  while (pending.length > 0) {
    const file = pending.pop();
    if (staged.has(file)) continue;
    staged.add(file);
    const source = join(appDir, file);
    const target = join(stagedApp, file);
    const relatives = [];
    await mkdir(dirname(target), { recursive: true });
    await writeFile(target, rewrite(await readFile(source, 'utf8'), target, stagedSdk, source, relatives, file === `${appName}.js`));
    for (const specifier of relatives) {
      const imported = relative(appDir, resolve(dirname(source), specifier));
      if (imported.startsWith('..')) {
        throw new Error(`${source} imports ${specifier}, outside ${appDir}: a module's files live in its directory`);
      }
      pending.push(imported);
    }
  }
  const entry = join(stage, 'entry.js');
  await writeFile(
    entry,
    [
      "import { log } from 'wasmop:reconciler/host@0.1.0';",
      "import { toGuest } from './wasmop-sdk/glue.js';",
      `import reconciler from './app/${appName}.js';`,
      'export const guest = toGuest(reconciler, log);',
      '',
    ].join('\n'),
  );
  const stagedWit = join(stage, 'wit');
  await cp(witDir, stagedWit, { recursive: true });
  _setPreopens({ [stagedWit]: stagedWit });
  // The staged directory is what the component's module loader sees (componentize-js maps the
  // current directory when the source is inside it).
  process.chdir(stage);
  const { component } = await componentize({
    sourcePath: entry,
    witPath: stagedWit,
    worldName: 'module',
    disableFeatures: ['http', 'fetch-event'],
  });
  await mkdir(dirname(out), { recursive: true });
  await writeFile(`${out}.tmp`, component);
  await rename(`${out}.tmp`, out);
  console.error(`js-module: built ${out} (${component.length} bytes) in ${((Date.now() - started) / 1000).toFixed(1)} s`);
} catch (e) {
  console.error(`js-module: building ${join(appDir, `${appName}.js`)} failed: ${e.message ?? e}`);
  process.exitCode = 1;
} finally {
  process.chdir(tmpdir());
  await rm(stage, { recursive: true, force: true });
}
