// The resolve hook of register.js: `wasmop-sdk[/name]` is this directory's `index.js` or `name.js`.
const here = new URL('./', import.meta.url);

export async function resolve(specifier, context, next) {
  if (specifier === 'wasmop-sdk') return { url: new URL('index.js', here).href, shortCircuit: true };
  if (specifier.startsWith('wasmop-sdk/')) {
    const name = specifier.slice('wasmop-sdk/'.length);
    if (/^[a-z]+$/.test(name)) return { url: new URL(`${name}.js`, here).href, shortCircuit: true };
  }
  return next(specifier, context);
}
