// `node --import <this file>`: resolves the bare specifier `wasmop-sdk` (and `wasmop-sdk/testing`)
// to this copy of the SDK, so a module's native tests run with no `npm install` (the component's
// build maps the same specifier to the same files, tools/build.mjs).
import { register } from 'node:module';

register('./resolve.js', import.meta.url);
