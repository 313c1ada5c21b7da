// What a module is called with: the primary, its owned children, related objects, context.
// Objects are plain JavaScript objects parsed from the host's JSON.
import { ReconcileError } from './errors.js';
import { gvk } from './kinds.js';

/** Parses JSON text from the host into an object; throws ReconcileError naming `what`. */
export function parseObject(text, what) {
  let value;
  try {
    value = JSON.parse(text);
  } catch (e) {
    throw new ReconcileError(`${what} is not JSON: ${e.message}`);
  }
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    throw new ReconcileError(`${what} is not a JSON object`);
  }
  return value;
}

/** Why a reconcile runs (the WIT `trigger` cases). */
export const TriggerKind = Object.freeze({
  PRIMARY_CHANGED: 'primary-changed',
  CHILD_CHANGED: 'child-changed',
  RELATED_CHANGED: 'related-changed',
  RESYNC: 'resync',
  REQUEUE: 'requeue',
  RETRY: 'retry',
  MODULE_CHANGED: 'module-changed',
  DRY_RUN: 'dry-run',
});

/**
 * Facts about this call: `reconciler` (the WasmReconciler's name), `trigger` (`{kind, object}`,
 * `object` an ObjectRef for a child or related change), `attempt`, `configJson` and `nowUnixMs`
 * (a number: milliseconds since the Unix epoch).
 */
export class Context {
  constructor({
    reconciler = 'test',
    trigger = { kind: TriggerKind.PRIMARY_CHANGED, object: undefined },
    attempt = 1,
    configJson = '{}',
    nowUnixMs = 0,
  } = {}) {
    this.reconciler = reconciler;
    this.trigger = trigger;
    this.attempt = attempt;
    this.configJson = configJson;
    this.nowUnixMs = nowUnixMs;
  }

  /** The WasmReconciler's config, parsed from JSON (`{}` when none). */
  get config() {
    try {
      return JSON.parse(this.configJson);
    } catch (e) {
      throw new ReconcileError(`the reconciler config is not JSON: ${e.message}`);
    }
  }
}

/**
 * A reconcile or finalize request: the primary (desired state) and the observed children and
 * related objects (actual state), grouped by kind. `owned` and `related` are lists of
 * `[Gvk, [json text]]`, as the host sends them.
 */
export class Request {
  constructor(primaryJson, owned, related, context) {
    this.primaryJson = primaryJson;
    this.ownedGroups = owned;
    this.relatedGroups = related;
    this.context = context;
    this.parsed = undefined;
  }

  /** The primary object, whole (metadata, spec, status), parsed once. */
  get primary() {
    this.parsed ??= parseObject(this.primaryJson, 'the primary');
    return this.parsed;
  }

  /** Every owned kind, in the order of the metadata. */
  ownedKinds() {
    return this.ownedGroups.map(([k]) => k);
  }

  /** The observed children of `kind` (those the primary controls). */
  owned(kind) {
    return objectsOf(this.ownedGroups, gvk(kind), 'an observed');
  }

  /** The related objects of `kind` that the selector matches. */
  related(kind) {
    return objectsOf(this.relatedGroups, gvk(kind), 'a related');
  }

  /** The WasmReconciler's config (parsed JSON). */
  get config() {
    return this.context.config;
  }
}

function objectsOf(groups, kind, what) {
  return groups
    .filter(([k]) => kind.equals(k))
    .flatMap(([, objects]) => objects.map((o) => parseObject(o, `${what} ${kind}`)));
}

/** The kind of change judged by `validate`. */
export const Operation = Object.freeze({ CREATE: 'create', UPDATE: 'update' });

/** A proposed change of a primary, at admission or in `wasmop test --validate`. */
export class ValidateRequest {
  constructor(operation, oldJson, newJson, configJson = '{}') {
    this.operation = operation;
    this.oldJson = oldJson ?? undefined;
    this.newJson = newJson;
    this.configJson = configJson;
  }

  /** The object before the change (undefined on create). */
  get old() {
    return this.oldJson === undefined ? undefined : parseObject(this.oldJson, 'the old object');
  }

  /** The object after the change. */
  get new() {
    return parseObject(this.newJson, 'the new object');
  }

  /** The WasmReconciler's config (parsed JSON). */
  get config() {
    return new Context({ configJson: this.configJson }).config;
  }
}
