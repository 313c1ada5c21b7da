// The error a module returns from reconcile or finalize.

/**
 * A module's own failure. Throw it (or any exception) from `reconcile` or `finalize`: the host
 * records the message as a Warning Event on the primary and retries with backoff. Another
 * exception is recorded by its name and where it was thrown only: its text may carry values
 * (a Secret's data in a TypeError) that would reach Events and logs.
 */
export class ReconcileError extends Error {
  /** @param {string} message */
  constructor(message) {
    super(message);
    this.name = 'ReconcileError';
  }

  /** The same error, with what was being done in front: `reading the spec: ...`. */
  context(what) {
    return new ReconcileError(`${what}: ${this.message}`);
  }
}
