// Running a reconciler natively under `node --test`.
//
//   import { Harness } from 'wasmop-sdk/testing';
//   const out = await new Harness(reconciler).primary(tenant).observed(quota).reconcile();
//   assert.equal(out.children(k8s.NAMESPACE).length, 1);
//
// The harness hands the reconciler the request the host (and `wasmop test`) would build: every
// owned and related kind present, observed objects grouped by kind, an observed object of a kind
// both owned and related counted as owned when it has a controller ownerReference. It checks what
// the host's intent validation checks first: every child is of an owned kind and has a name. It
// runs the reconciler through the same conversions the component uses (to and from the WIT
// shapes), so what passes here is what the component answers. Objects are plain objects (parse
// YAML fixtures yourself, or use JSON); `wasmop test` on the built component reads YAML.
import { readFileSync } from 'node:fs';
import { ReconcileError } from './errors.js';
import { Gvk } from './kinds.js';
import { setSink } from './log.js';
import { Context, Operation, Request, TriggerKind, ValidateRequest } from './request.js';
import { Finalized } from './response.js';
import { finalizeOut, responseOut, validationOut } from './glue.js';

const controlled = (obj) => (obj.metadata?.ownerReferences ?? []).some((r) => r.controller === true);

/** Builds a request for a reconciler and runs it natively. */
export class Harness {
  constructor(reconciler) {
    this.reconciler = reconciler;
    this.meta = reconciler.metadata();
    this.primaryObject = undefined;
    this.ownedGroups = this.meta.ownedKinds.map((k) => [k, []]);
    this.relatedGroups = this.meta.relatedKinds.map((r) => [r.kind, []]);
    this.context = new Context({ trigger: { kind: TriggerKind.DRY_RUN, object: undefined } });
    /** `[level, message]` of every line logged by the last call. */
    this.logs = [];
  }

  /** The primary object. */
  primary(obj) {
    const kind = Gvk.of(obj);
    if (!kind.equals(this.meta.primaryKind)) {
      throw new TypeError(`the object is a ${kind}, but module ${this.meta.name} reconciles ${this.meta.primaryKind}`);
    }
    this.primaryObject = obj;
    return this;
  }

  /** The primary object, from a JSON file. */
  primaryFile(path) {
    return this.primary(JSON.parse(readFileSync(path, 'utf8')));
  }

  /** An observed owned child or related object. */
  observed(obj) {
    const kind = Gvk.of(obj);
    const relatedToo = this.relatedGroups.some(([k]) => k.equals(kind));
    const groups = [...this.ownedGroups.filter(() => !relatedToo || controlled(obj)), ...this.relatedGroups];
    const group = groups.find(([k]) => k.equals(kind));
    if (!group) throw new TypeError(`observed ${kind} is neither owned nor related by module ${this.meta.name}`);
    group[1].push(JSON.stringify(obj));
    return this;
  }

  /** The WasmReconciler's config (any JSON value). */
  config(config) {
    this.context.configJson = JSON.stringify(config);
    return this;
  }

  /** Why the reconcile runs (default: dry-run, as in `wasmop test`): `{kind, object}`. */
  trigger(trigger) {
    this.context.trigger = trigger;
    return this;
  }

  /** The time the module sees (milliseconds since the Unix epoch). */
  nowUnixMs(now) {
    this.context.nowUnixMs = now;
    return this;
  }

  /** The request the reconciler will be called with. */
  request() {
    if (this.primaryObject === undefined) throw new TypeError('the harness has no primary object: call primary()');
    return new Request(JSON.stringify(this.primaryObject), this.ownedGroups, this.relatedGroups, this.context);
  }

  async capture(call) {
    this.logs = [];
    setSink((level, message) => this.logs.push([level, message]));
    try {
      return await call();
    } finally {
      setSink(null);
    }
  }

  /** Runs reconcile; rejects if it fails or asks for a child it may not own. */
  async reconcile() {
    const response = await this.capture(() => this.reconciler.reconcile(this.request()));
    responseOut(response);
    for (const [kind, objects] of response.childSets) {
      if (!this.meta.ownedKinds.some((k) => k.equals(kind))) {
        throw new ReconcileError(`a child of kind ${kind}, which module ${this.meta.name} does not own`);
      }
      if (objects.some((o) => !o.metadata?.name)) throw new ReconcileError(`a ${kind} child has no metadata.name`);
    }
    return response;
  }

  /** Runs finalize (finished when the reconciler has none); rejects if it fails or returns children. */
  async finalize() {
    const finalized = this.reconciler.finalize
      ? await this.capture(() => this.reconciler.finalize(this.request()))
      : Finalized.finished();
    finalizeOut(finalized);
    return finalized;
  }

  /** Runs validate on the creation of `newObject`, or with `oldObject` on a change. */
  async validate(newObject, oldObject = undefined) {
    const request = new ValidateRequest(
      oldObject === undefined ? Operation.CREATE : Operation.UPDATE,
      oldObject === undefined ? undefined : JSON.stringify(oldObject),
      JSON.stringify(newObject),
      this.context.configJson,
    );
    const verdict = await this.capture(() => this.reconciler.validate(request));
    validationOut(verdict);
    return verdict;
  }
}
