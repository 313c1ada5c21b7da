// Kinds, references and what a module says about itself (`Metadata`).

/** A group/version/kind, as in an object's `apiVersion` and `kind`. Immutable. */
export class Gvk {
  /** @param {string} apiVersion `v1`, `apps/v1`, `example.com/v1alpha1` @param {string} kind */
  constructor(apiVersion, kind) {
    this.apiVersion = apiVersion;
    this.kind = kind;
    Object.freeze(this);
  }

  /** The kind of a Kubernetes object; throws TypeError if it has no apiVersion or kind. */
  static of(obj) {
    const apiVersion = obj?.apiVersion;
    const kind = obj?.kind;
    if (typeof apiVersion !== 'string' || typeof kind !== 'string' || !apiVersion || !kind) {
      throw new TypeError('an object has no apiVersion or kind');
    }
    return new Gvk(apiVersion, kind);
  }

  /** Whether `other` (a Gvk or any `{apiVersion, kind}`) is the same kind. */
  equals(other) {
    return other != null && other.apiVersion === this.apiVersion && other.kind === this.kind;
  }

  toString() {
    return `${this.apiVersion}/${this.kind}`;
  }
}

/** A `{apiVersion, kind}` as a Gvk. */
export function gvk(value) {
  return value instanceof Gvk ? value : new Gvk(value?.apiVersion, value?.kind);
}

/**
 * A reference to one object. `namespace` is undefined for cluster-scoped objects (and, for a
 * namespaced target of an intent, means the primary's namespace).
 */
export class ObjectRef {
  constructor(apiVersion, kind, name, namespace = undefined) {
    this.apiVersion = apiVersion;
    this.kind = kind;
    this.name = name;
    this.namespace = namespace ?? undefined;
    Object.freeze(this);
  }

  /** A reference to the object `name` of kind `kind` (a Gvk). */
  static to(kind, name, namespace = undefined) {
    return new ObjectRef(kind.apiVersion, kind.kind, name, namespace);
  }

  /** A reference to a Kubernetes object (its kind, name and namespace). */
  static of(obj) {
    const kind = Gvk.of(obj);
    const meta = obj.metadata ?? {};
    return new ObjectRef(kind.apiVersion, kind.kind, String(meta.name ?? ''), meta.namespace);
  }

  /** The same reference in `namespace`. */
  inNamespace(namespace) {
    return new ObjectRef(this.apiVersion, this.kind, this.name, namespace);
  }

  /** The referenced kind. */
  gvk() {
    return new Gvk(this.apiVersion, this.kind);
  }
}

/** Label-selector operators (the WIT `selector-operator`). */
export const SelectorOperator = Object.freeze({
  IN: 'in',
  NOT_IN: 'not-in',
  EXISTS: 'exists',
  DOES_NOT_EXIST: 'does-not-exist',
});

const OPERATORS = new Set(Object.values(SelectorOperator));

/** A Kubernetes label selector. Empty selects everything. Immutable: each method returns a new one. */
export class Selector {
  constructor(matchLabels = [], matchExpressions = []) {
    this.matchLabels = Object.freeze([...matchLabels]);
    this.matchExpressions = Object.freeze([...matchExpressions]);
    Object.freeze(this);
  }

  /** Selects every object. */
  static everything() {
    return new Selector();
  }

  /** Also requires `key=value`. */
  label(key, value) {
    return new Selector([...this.matchLabels, [key, value]], this.matchExpressions);
  }

  /** Also requires an expression: `requirement('tier', SelectorOperator.IN, ['web'])`. */
  requirement(key, operator, values = []) {
    if (!OPERATORS.has(operator)) {
      throw new TypeError(`unknown selector operator ${JSON.stringify(operator)}`);
    }
    const req = Object.freeze({ key, operator, values: Object.freeze([...values]) });
    return new Selector(this.matchLabels, [...this.matchExpressions, req]);
  }

  /** Whether objects with these labels (an object of strings) are selected. */
  matches(labels = {}) {
    const has = (k) => Object.prototype.hasOwnProperty.call(labels, k);
    if (this.matchLabels.some(([k, v]) => labels[k] !== v || !has(k))) return false;
    return this.matchExpressions.every((e) => {
      const present = has(e.key);
      switch (e.operator) {
        case SelectorOperator.IN: return present && e.values.includes(labels[e.key]);
        case SelectorOperator.NOT_IN: return !(present && e.values.includes(labels[e.key]));
        case SelectorOperator.EXISTS: return present;
        default: return !present;
      }
    });
  }
}

/** Which primaries an event on a related object re-reconciles. */
export const Mapping = Object.freeze({
  /** Every primary of the reconciler. */
  ALL_PRIMARIES: Object.freeze({ tag: 'all-primaries' }),
  /** The primary with the same namespace and name as the related object. */
  SAME_NAME: Object.freeze({ tag: 'same-name' }),
  /** The primary named by the value of `label` on the related object. */
  primaryNamedByLabel(label) {
    return Object.freeze({ tag: 'primary-named-by-label', val: label });
  },
});

/** A kind the module reads but does not own, and how its objects map to primaries. */
export class RelatedKind {
  constructor(kind, selector = Selector.everything(), mapsTo = Mapping.ALL_PRIMARIES) {
    this.kind = gvk(kind);
    this.selector = selector;
    this.mapsTo = mapsTo;
    Object.freeze(this);
  }

  /** Only objects matching `selector` are watched and handed over. */
  withSelector(selector) {
    return new RelatedKind(this.kind, selector, this.mapsTo);
  }

  /** Which primaries an event re-reconciles (a `Mapping` value). */
  mapped(mapping) {
    return new RelatedKind(this.kind, this.selector, mapping);
  }
}

/**
 * What a module says about itself: name, version, primary, owned and related kinds. Build it by
 * chaining: `new Metadata('tenants', '0.1.0').primary(TENANT).owns(k8s.NAMESPACE)`.
 */
export class Metadata {
  constructor(name, version) {
    this.name = name;
    this.version = version;
    this.primaryKind = undefined;
    this.ownedKinds = [];
    this.relatedKinds = [];
    this.finalizesWork = false;
    this.validatesWork = false;
  }

  /** The kind this module reconciles. */
  primary(kind) {
    this.primaryKind = gvk(kind);
    return this;
  }

  /** Kinds whose objects the module creates and owns (the host prunes them). */
  owns(...kinds) {
    for (const k of kinds.map(gvk)) {
      if (!this.ownedKinds.some((o) => o.equals(k))) this.ownedKinds.push(k);
    }
    return this;
  }

  /** A kind the module reads and reacts to (a `RelatedKind`, or a Gvk: every object, every primary). */
  related(related) {
    this.relatedKinds.push(related instanceof RelatedKind ? related : new RelatedKind(related));
    return this;
  }

  /** `finalize` does work: the host keeps a finalizer on every primary. */
  finalizes() {
    this.finalizesWork = true;
    return this;
  }

  /** `validate` does work: the host can serve it at admission. */
  validates() {
    this.validatesWork = true;
    return this;
  }
}
