// A JavaScript module for the host's tests (host/tests/js.rs): built with the pinned
// componentize-js (scripts/js-module.sh) and run through the engine with its real limits. The
// config's `mode` picks a behaviour; the default answers the whole response vocabulary.
import { Condition, Event, Finalized, Gvk, Mapping, Metadata, ObjectRef, ReconcileError, RelatedKind, Response, Selector, Validation, k8s, log } from 'wasmop-sdk';
import { describe } from './describe.js';

const PROBE = new Gvk('example.wasmop.dev/v1', 'Probe');

// Module state: a fresh instance per call starts it at 0 every time.
let calls = 0;

export default {
  metadata() {
    return new Metadata('js-probe', '0.1.0')
      .primary(PROBE)
      .owns(k8s.CONFIG_MAP)
      .related(new RelatedKind(k8s.SECRET, Selector.everything().label('probe', 'yes'), Mapping.SAME_NAME))
      .finalizes()
      .validates();
  },

  async reconcile(request) {
    calls += 1;
    const probe = request.primary;
    const mode = request.config.mode ?? 'answer';
    switch (mode) {
      case 'fail':
        throw new ReconcileError(`probe ${probe.metadata.name} fails on purpose`);
      case 'crash':
        // A TypeError whose text carries a value: the host must not see it.
        throw new TypeError(`secret=${probe.spec.secret}`);
      case 'spin':
        for (;;) {}
      case 'hog': {
        // 16 MiB at a time: the memory cap stops it within a few allocations.
        const hog = [];
        for (;;) hog.push(new Uint8Array(16 << 20));
      }
      case 'log':
        for (let i = 0; i < 5; i += 1) log.info(`line ${i}`);
        break;
      default:
        break;
    }
    // An await, so the response comes from a resumed async function.
    const now = await Promise.resolve(Date.now());
    return Response.complete(request)
      .child({
        apiVersion: 'v1',
        kind: 'ConfigMap',
        metadata: { name: `${probe.metadata.name}-probe`, labels: { probe: 'yes' } },
        data: { message: describe(probe), secrets: request.related(k8s.SECRET).map((s) => s.metadata.name).join(',') },
      })
      .withStatus({
        calls,
        dateNow: now,
        contextNow: request.context.nowUnixMs,
        trigger: request.context.trigger.kind,
        random: Math.random(),
      })
      .condition(Condition.of('Ready', true).withReason('Probed'))
      .event(Event.normal('Probed', `probed ${probe.metadata.name}`).about(ObjectRef.of(probe)))
      .requeueAfter(90);
  },

  finalize(request) {
    return Finalized.pending().withEffects(
      new Response().delete(ObjectRef.to(k8s.CONFIG_MAP, `${request.primary.metadata.name}-probe`)).requeueAfter(1),
    );
  },

  validate(request) {
    if (request.new.spec?.message === undefined) return Validation.deny('spec.message is required', 'spec.message');
    return Validation.allow().warn(`operation ${request.operation}`);
  },
};
