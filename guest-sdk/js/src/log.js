// Logging to the host.
//
// In a module, lines go to the host's log, tagged with the module's name and the object being
// reconciled (lines beyond the host's per-call budget are dropped and counted). Natively (node
// --test) they go to stderr, and the testing harness collects them.

/** How important a line is (the WIT `log-level`). */
export const Level = Object.freeze({
  TRACE: 'trace',
  DEBUG: 'debug',
  INFO: 'info',
  WARN: 'warn',
  ERROR: 'error',
});

const LEVELS = new Set(Object.values(Level));

function stderr(level, message) {
  // `console` is only there to be a native default; in a component the host sink replaces it.
  console.error(`${level.toUpperCase()} ${message}`);
}

let sink = stderr;

/**
 * Where lines go: `(level, message) => void` (the harness collects them; the component's entry
 * sends them to the host). `null` restores stderr.
 */
export function setSink(fn) {
  sink = fn ?? stderr;
}

/** Writes one line at `level` (a `Level` value). */
export function log(level, message) {
  if (!LEVELS.has(level)) throw new TypeError(`unknown log level ${JSON.stringify(level)}`);
  sink(level, String(message));
}

export const trace = (message) => log(Level.TRACE, message);
export const debug = (message) => log(Level.DEBUG, message);
export const info = (message) => log(Level.INFO, message);
export const warn = (message) => log(Level.WARN, message);
export const error = (message) => log(Level.ERROR, message);
