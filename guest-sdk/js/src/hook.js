// Metacontroller hooks written for fission's Node.js environment, run unchanged as components of
// the `hook` world (wit/reconciler.wit, `interface hooks`):
//
//   module.exports = async function (context) {
//     const observed = context.request.body;           // the request document, parsed
//     ...
//     return { status: 200, body: desired, headers: { 'Content-Type': 'application/json' } };
//   };
//
// The hook file is evaluated as CommonJS (`module`, `exports`, a `require` that refuses every
// name, `__filename`, `__dirname`, and a `console` that writes to the host's log), once, when
// the component is built (componentize-js snapshots it). Each `call` builds the `context` of a
// POST of the request document to the hook's path, awaits the hook and maps its answer: a 2xx
// status (or none) is `ok` with the body's text (a string body as it is, anything else as JSON),
// another status is `err` with that status and the body's text, a throw is `err` 500 with the
// error's type and where it was thrown, never its text (it may carry a Secret's value), and the
// error's type and the hook's frames go to the log.
//
// Pure JavaScript: the component's entry (written by tools/build-hook.mjs) imports it and hands
// it the hook's source and the host's `log`; the SDK's tests call it natively on the same shapes.

/** The most bytes (UTF-8) of a body `call` returns as `ok`: the host's default output cap. */
export const MAX_BODY_BYTES = 4 << 20;
/** An error's message is cut to this many characters (it goes to Metacontroller-style logs). */
export const MAX_MESSAGE_CHARS = 64 << 10;
/** A console line is cut to this many characters (the host cuts at 4,096 bytes too). */
export const MAX_LOG_LINE_CHARS = 4096;
/** Console lines a call may write; the rest are dropped, and one line says how many. */
export const MAX_LOG_LINES = 256;

const LEVELS = { log: 'info', info: 'info', dir: 'info', debug: 'debug', trace: 'trace', warn: 'warn', error: 'error' };

/** `text` cut to `max` characters, never between the halves of a surrogate pair. */
export function cut(text, max) {
  if (text.length <= max) return text;
  let end = max;
  const code = text.charCodeAt(end - 1);
  if (code >= 0xd800 && code <= 0xdbff) end -= 1;
  return `${text.slice(0, end)}... (${text.length - end} more characters)`;
}

/** `String(v)`, or what `v` is when it cannot be written (its `toString` throws). */
function safeString(v) {
  try {
    return String(v);
  } catch {
    return `a ${typeof v} that cannot be written as text`;
  }
}

/** The frames of `stack` above the adapter's `callHook` or `bodyText` (the hook's own; the rest is the adapter's and the runtime's). */
function hookFrames(stack) {
  const lines = stack.trimEnd().split('\n');
  const end = lines.findIndex((line) => /\b(callHook|bodyText)\b/.test(line));
  return (end < 0 ? lines : lines.slice(0, end)).join('\n');
}

/** An error as Node writes it: `TypeError: message`, then the hook's frames of its stack. */
export function errorText(e) {
  if (!(e instanceof Error)) return safeString(e);
  const head = safeString(e);
  const stack = typeof e.stack === 'string' ? hookFrames(e.stack) : '';
  if (!stack) return head;
  // V8's stack starts with the head; SpiderMonkey's is the frames only.
  return stack.startsWith(head) ? stack : `${head}\n${stack}`;
}

const NOT_SHOWN = 'its text is not shown, it may carry values: answer {status, body} to say more';

/** What was thrown, by its type only: `TypeError`, `a thrown string`. */
function thrownName(e) {
  if (e instanceof Error) return safeString(e.name) || 'Error';
  return `a thrown ${e === null ? 'null' : typeof e}`;
}

/**
 * The hook's frames of what was thrown, without its text: SpiderMonkey's stack is frames only
 * (`fn@sync.js:12:3`); V8's starts with `TypeError: message`, which is cut off. A stack of
 * another shape (a message changed after the throw, a stack the hook wrote) gives no frames.
 */
export function thrownFrames(e) {
  if (!(e instanceof Error) || typeof e.stack !== 'string') return '';
  const head = safeString(e);
  let stack = e.stack;
  if (stack.startsWith(`${head}\n`)) stack = stack.slice(head.length + 1);
  else if (!/^[^\n]*@[^\n]*:\d+:\d+$/m.test(stack.split('\n', 1)[0])) return '';
  return hookFrames(stack);
}

/** `sync.js:12` of the first of `frames` (SpiderMonkey's `fn@sync.js:12:3`, V8's `at fn (sync.js:12:3)`). */
function firstLocation(frames) {
  for (const line of frames.split('\n')) {
    const m = /([^/\\@( ]+):(\d+):\d+\)?\s*$/.exec(line.trim());
    if (m) return `${m[1]}:${m[2]}`;
  }
  return undefined;
}

/**
 * What was thrown, for the 500 answer: its type and where (`TypeError at sync.js:12`), never
 * its text, which may carry values (a Secret's, formatted into the message) and would reach the
 * parent's Events and the host's log, as the SDK's reconcile-error does.
 */
export function thrownMessage(e) {
  if (e instanceof AdapterError) return safeString(e);
  const where = firstLocation(thrownFrames(e));
  return `${thrownName(e)}${where ? ` at ${where}` : ''} (${NOT_SHOWN})`;
}

/** What was thrown, for the log: its type and the hook's frames, without its text. */
export function thrownLog(e) {
  const frames = thrownFrames(e);
  const head = e instanceof AdapterError ? safeString(e) : `${thrownName(e)} (${NOT_SHOWN})`;
  return `${head}${frames ? `\n${frames}` : ''}`;
}

/** One console argument as text: strings as they are, errors with their stack, objects as JSON. */
function formatArg(v) {
  if (typeof v === 'string') return v;
  if (v instanceof Error) return errorText(v);
  if (v !== null && typeof v === 'object') {
    try {
      return JSON.stringify(v);
    } catch {
      return safeString(v);
    }
  }
  return safeString(v);
}

/**
 * The hook's `console` and its per-call budget: `write(level, line)` gets each line (cut to
 * MAX_LOG_LINE_CHARS); `reset()` starts a call's budget of MAX_LOG_LINES; `flush()` writes one
 * line saying how many were dropped, if any.
 */
export function hookConsole(write) {
  const budget = { left: MAX_LOG_LINES, dropped: 0 };
  const line = (level) => (...args) => {
    if (budget.left === 0) {
      budget.dropped += 1;
      return;
    }
    budget.left -= 1;
    write(level, cut(args.map(formatArg).join(' '), MAX_LOG_LINE_CHARS));
  };
  const console = Object.fromEntries(Object.entries(LEVELS).map(([name, level]) => [name, line(level)]));
  return {
    console,
    /** A line of the adapter's own (what a call threw), outside the hook's budget. */
    error(text) {
      write('error', cut(text, MAX_LOG_LINE_CHARS));
    },
    reset() {
      budget.left = MAX_LOG_LINES;
      budget.dropped = 0;
    },
    flush() {
      if (budget.dropped > 0) write('warn', `console: ${budget.dropped} lines over the hook's ${MAX_LOG_LINES} per call were dropped`);
      budget.dropped = 0;
    },
  };
}

/** An error of the adapter's own (a refused `require`), whose text says what to change and is shown. */
class AdapterError extends Error {}
AdapterError.prototype.name = 'Error';

/** The hook's `require`: a hook runs without Node's modules, files or network. */
function refuse(filename) {
  return (name) => {
    throw new AdapterError(
      `${filename}: require(${JSON.stringify(name)}) is not available: a hook runs in a Wasm sandbox, ` +
        "without Node's modules, npm packages, files or network; put what it needs into the hook file",
    );
  };
}

/** What a value is, for messages: `undefined`, `a string`, `an object`. */
function describe(v) {
  if (v === undefined || v === null) return String(v);
  const type = Array.isArray(v) ? 'array' : typeof v;
  return `${/^[aeiou]/.test(type) ? 'an' : 'a'} ${type}`;
}

/** The CommonJS wrapper of `source`, on its first line (stack lines keep the file's numbers). */
function wrap(source, filename) {
  const body = source.replace(/^#!.*/, '');
  return `(function (module, exports, require, __filename, __dirname, console) {${body}\n})\n//# sourceURL=${filename}`;
}

/**
 * Evaluates `source` as CommonJS (sloppy mode, as Node does) and returns its `module.exports`,
 * which must be the hook function. `console` is the hook's console.
 */
export function loadHook(source, filename, console) {
  let wrapper;
  try {
    // An indirect eval: global scope, sloppy mode, the wrapper Node puts around a CommonJS file.
    wrapper = (0, eval)(wrap(source, filename));
  } catch (e) {
    if (!(e instanceof SyntaxError)) throw e;
    throw new SyntaxError(
      `${filename} is not a CommonJS script: ${e.message} (a hook sets \`module.exports = async function (context) {...}\`)`,
    );
  }
  const module = { exports: {} };
  wrapper.call(module.exports, module, module.exports, refuse(filename), filename, '.', console);
  if (typeof module.exports !== 'function') {
    throw new TypeError(
      `${filename} exports ${describe(module.exports)}, not a function: a hook sets \`module.exports = async function (context) {...}\``,
    );
  }
  return module.exports;
}

/**
 * The `context` fission's Node.js environment gives a hook for a WIT `hook-request`: the
 * request of a POST of the JSON document to the hook's path (`/<kind>` when none is given).
 */
export function hookContext(request) {
  const path = request.path || `/${request.kind}`;
  const headers = { 'content-type': 'application/json' };
  return {
    request: {
      method: 'POST',
      url: path,
      originalUrl: path,
      path,
      headers,
      query: {},
      params: {},
      body: JSON.parse(request.body),
      get: (name) => headers[String(name).toLowerCase()],
    },
  };
}

const failure = (status, message) => ({ tag: 'err', val: { status, message: cut(message, MAX_MESSAGE_CHARS) } });

/** The text of a body: a string as it is, anything else as JSON (nothing: empty), as Node sends it. */
function bodyText(body) {
  if (typeof body === 'string') return body;
  return JSON.stringify(body) ?? '';
}

/** The UTF-8 size of `text`, counted only when it could be over `max`. */
function overSize(text, max) {
  if (text.length * 3 <= max) return undefined;
  const bytes = text.length > max ? text.length : new TextEncoder().encode(text).length;
  return bytes > max ? bytes : undefined;
}

/** The WIT `result<string, hook-error>` of what a hook answered (`{status, body, headers}`). */
export function answer(result) {
  if (result === null || typeof result !== 'object') {
    return failure(500, `the hook answered ${describe(result)}, not {status, body}`);
  }
  const status = Number(result.status ?? 200);
  if (!Number.isInteger(status) || status < 100 || status > 599) {
    return failure(500, `the hook answered status ${safeString(result.status)}, not an HTTP status (100-599)`);
  }
  let text;
  try {
    text = bodyText(result.body);
  } catch (e) {
    // A toJSON of the hook's may throw: its text is not shown either.
    return failure(500, `the hook's body cannot be written as JSON (a cycle, a BigInt, a toJSON that throws): ${thrownMessage(e)}`);
  }
  if (status < 200 || status > 299) return failure(status, text);
  const size = overSize(text, MAX_BODY_BYTES);
  if (size !== undefined) {
    return failure(500, `the hook's body is ${size} bytes, over the ${MAX_BODY_BYTES} a hook may answer (MAX_BODY_BYTES, guest-sdk/js/src/hook.js)`);
  }
  return { tag: 'ok', val: text };
}

/** One call of `hook` for a WIT `hook-request`, its console lines counted by `logs`. */
export async function callHook(hook, request, logs) {
  let context;
  try {
    context = hookContext(request);
  } catch (e) {
    return failure(400, `the ${request.kind} request's body is not JSON: ${e.message}`);
  }
  logs.reset();
  try {
    return answer(await hook(context));
  } catch (e) {
    logs.error(thrownLog(e));
    return failure(500, thrownMessage(e));
  } finally {
    logs.flush();
  }
}

function stderr(level, line) {
  // Natively and while the component is built (the hook's top level): the host's log is not there.
  globalThis.console.error(`${level.toUpperCase()} ${line}`);
}

/**
 * The object the component exports as `wasmop:reconciler/hooks`, for the hook file `source`
 * (named `filename` in messages and stacks). `hostLog` is the `wasmop:reconciler/host` `log`:
 * the hook's console writes to it once loaded (its top level writes to stderr).
 */
export function toHooks(source, filename, hostLog) {
  const sink = { write: stderr };
  const logs = hookConsole((level, line) => sink.write(level, line));
  const hook = loadHook(source, filename, logs.console);
  if (hostLog) sink.write = hostLog;
  return { call: (request) => callHook(hook, request, logs) };
}
