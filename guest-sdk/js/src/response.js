// What a module answers: intents (children, actions, status, Events, requeue) and verdicts.
import { ReconcileError } from './errors.js';
import { Gvk, gvk } from './kinds.js';

/** How a delete propagates to the object's dependents. */
export const Propagation = Object.freeze({
  BACKGROUND: 'background',
  FOREGROUND: 'foreground',
  ORPHAN: 'orphan',
});

/** The kind of an imperative intent. */
export const ActionKind = Object.freeze({
  MERGE_PATCH: 'merge-patch',
  JSON_PATCH: 'json-patch',
  DELETE: 'delete',
});

/** A condition's status (as Kubernetes writes it). */
export const ConditionStatus = Object.freeze({ TRUE: 'True', FALSE: 'False', UNKNOWN: 'Unknown' });

/**
 * A status condition; the host adds `lastTransitionTime` and `observedGeneration`.
 * `Condition.of('Ready', true).withReason('Provisioned').withMessage('...')`.
 */
export class Condition {
  constructor(type, status, reason = '', message = '') {
    if (!Object.values(ConditionStatus).includes(status)) {
      throw new TypeError(`a condition status is True, False or Unknown, not ${JSON.stringify(status)}`);
    }
    this.type = type;
    this.status = status;
    this.reason = reason;
    this.message = message;
    Object.freeze(this);
  }

  /** A condition that is true or false. */
  static of(type, status) {
    return new Condition(type, status ? ConditionStatus.TRUE : ConditionStatus.FALSE);
  }

  /** A condition whose status is Unknown. */
  static unknown(type) {
    return new Condition(type, ConditionStatus.UNKNOWN);
  }

  /** Sets the CamelCase reason. */
  withReason(reason) {
    return new Condition(this.type, this.status, reason, this.message);
  }

  /** Sets the message. */
  withMessage(message) {
    return new Condition(this.type, this.status, this.reason, message);
  }
}

/** Normal or Warning. */
export const EventType = Object.freeze({ NORMAL: 'Normal', WARNING: 'Warning' });

/** A Kubernetes Event (repeats are counted by the host, not duplicated). */
export class Event {
  constructor(type, reason, message, action = '', regarding = undefined) {
    this.type = type;
    this.reason = reason;
    this.message = message;
    this.action = action;
    this.regarding = regarding;
    Object.freeze(this);
  }

  /** A Normal event about the primary. */
  static normal(reason, message) {
    return new Event(EventType.NORMAL, reason, message);
  }

  /** A Warning event about the primary. */
  static warning(reason, message) {
    return new Event(EventType.WARNING, reason, message);
  }

  /** Sets the CamelCase action (`Reconcile` when empty). */
  withAction(action) {
    return new Event(this.type, this.reason, this.message, action, this.regarding);
  }

  /** About another object than the primary (an ObjectRef). */
  about(ref) {
    return new Event(this.type, this.reason, this.message, this.action, ref);
  }
}

function plainObject(value, what) {
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    throw new ReconcileError(`${what} must be an object`);
  }
  // A deep copy, and a check that it is JSON (no cycles, no BigInt).
  try {
    return JSON.parse(JSON.stringify(value));
  } catch (e) {
    throw new ReconcileError(`${what} is not JSON: ${e.message}`);
  }
}

/**
 * The intents of one reconcile. Build it by chaining; every method returns the response.
 *
 * `Response.complete(request)` declares every owned kind a complete set: each existing child
 * not added with `child` is pruned. `new Response()` leaves kinds not mentioned alone.
 */
export class Response {
  constructor() {
    /** `[Gvk, [object]]` per kind, in the order the kinds were first named. */
    this.childSets = [];
    /** `{kind, target, patch, propagation}` per action, in order. */
    this.actions = [];
    /** `{fields, conditions}`, or undefined to leave the status untouched. */
    this.status = undefined;
    this.events = [];
    /** Milliseconds, or undefined. */
    this.requeueMs = undefined;
  }

  /** A declarative response: every owned kind of `request` is a complete set, initially empty. */
  static complete(request) {
    const r = new Response();
    for (const kind of request.ownedKinds()) r.setOf(kind);
    return r;
  }

  /** The desired objects of `kind` (created empty when the kind is not named yet). */
  setOf(kind) {
    const k = gvk(kind);
    let set = this.childSets.find(([g]) => g.equals(k));
    if (!set) {
      set = [k, []];
      this.childSets.push(set);
    }
    return set[1];
  }

  /** Declares the complete set of children of `kind` empty unless children are added. */
  noneOf(kind) {
    this.setOf(kind);
    return this;
  }

  /**
   * Adds a desired child: an object with `apiVersion`, `kind` and `metadata.name` (a namespaced
   * child's namespace defaults to the primary's).
   */
  child(obj) {
    let kind;
    try {
      kind = Gvk.of(obj);
    } catch (e) {
      throw new ReconcileError(`a child: ${e.message}`);
    }
    this.setOf(kind).push(plainObject(obj, `a ${kind} child`));
    return this;
  }

  /** Adds an RFC 7386 merge patch (an object) of `target` (an ObjectRef). */
  mergePatch(target, patch) {
    this.actions.push({ kind: ActionKind.MERGE_PATCH, target, patch: plainObject(patch, 'a merge patch') });
    return this;
  }

  /** Adds an RFC 6902 JSON patch (an array of operations) of `target`. */
  jsonPatch(target, operations) {
    if (!Array.isArray(operations)) throw new ReconcileError('a JSON patch must be an array of operations');
    this.actions.push({ kind: ActionKind.JSON_PATCH, target, patch: JSON.parse(JSON.stringify(operations)) });
    return this;
  }

  /** Deletes `target`. */
  delete(target, propagation = Propagation.BACKGROUND) {
    if (!Object.values(Propagation).includes(propagation)) {
      throw new TypeError(`unknown propagation ${JSON.stringify(propagation)}`);
    }
    this.actions.push({ kind: ActionKind.DELETE, target, patch: undefined, propagation });
    return this;
  }

  /** Sets the status fields (other than conditions and observedGeneration). */
  withStatus(fields) {
    this.status ??= { fields: {}, conditions: [] };
    this.status.fields = plainObject(fields, 'the status');
    return this;
  }

  /** Adds (or replaces, by type) a status condition. */
  condition(condition) {
    this.status ??= { fields: {}, conditions: [] };
    this.status.conditions = [...this.status.conditions.filter((c) => c.type !== condition.type), condition];
    return this;
  }

  /** Records an Event. */
  event(event) {
    this.events.push(event);
    return this;
  }

  /** Asks to be reconciled again after `seconds` (may be fractional). */
  requeueAfter(seconds) {
    if (!Number.isFinite(seconds) || seconds < 0) {
      throw new ReconcileError(`requeueAfter needs a number of seconds >= 0, not ${seconds}`);
    }
    this.requeueMs = Math.round(seconds * 1000);
    return this;
  }

  // For tests.

  /** The desired children of `kind`. */
  children(kind) {
    const k = gvk(kind);
    return this.childSets.filter(([g]) => g.equals(k)).flatMap(([, objects]) => objects);
  }

  /** The status condition of this type, if set. */
  conditionOf(type) {
    return this.status?.conditions.find((c) => c.type === type);
  }
}

/**
 * The result of a finalize: done, or pending (called again later), with side effects (actions,
 * status, Events, requeue; no children).
 */
export class Finalized {
  constructor(done, effects = new Response()) {
    this.done = done;
    this.effects = effects;
  }

  /** Clean-up is complete: the host removes its finalizer. */
  static finished() {
    return new Finalized(true);
  }

  /** Clean-up is not complete; finalize runs again. */
  static pending() {
    return new Finalized(false);
  }

  /** With these actions, status, Events and requeue delay (a Response without children). */
  withEffects(effects) {
    this.effects = effects;
    return this;
  }
}

/**
 * The verdict on a proposed change: allowed (with warnings) or denied (with a message and maybe
 * the offending field).
 */
export class Validation {
  constructor(allowed, { warnings = [], message = '', field = undefined } = {}) {
    this.allowed = allowed;
    this.warnings = warnings;
    this.message = message;
    this.field = field;
  }

  /** Allowed. */
  static allow() {
    return new Validation(true);
  }

  /** Refused, because of `field` (a JSON path such as `spec.quota.cpu`) if given. */
  static deny(message, field = undefined) {
    return new Validation(false, { message, field });
  }

  /** Adds a warning (to an allowed verdict). */
  warn(warning) {
    if (this.allowed) this.warnings.push(warning);
    return this;
  }
}
