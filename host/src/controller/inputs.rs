//! The inputs of a module call, fingerprinted (issue 27): a reconcile whose inputs are the same
//! as those of a call that left nothing to do does not call the module again.
//!
//! What a module sees is its request: the primary, its children, the related objects it asked
//! for, the reconciler's config, and the module itself. Everything else in the request (the
//! trigger, the attempt, the time) describes the call, not the state. When every input is
//! byte for byte the same as in a call that succeeded, asked for no requeue, wrote everything
//! and held no status back, a module that derives its answer from its inputs answers the
//! same, and its writes would change nothing (see [`super::noop`]): a resync, a relist or an
//! event that changed nothing costs no call. Metacontroller does the same for its hooks.
//!
//! # Guarantees
//! - Any change of the primary (its resourceVersion, hence any field, the status included),
//!   of a child or related object the module is sent (added, removed or changed), of the
//!   config or of the module (its sha256) calls the module.
//! - A call that asked for a requeue (sooner than the resync), failed, had a write fail or
//!   held its status back is never the reference: the next reconcile calls the module.
//!
//! # Caveats
//! A module whose answer depends on the time (`context.now-unix-ms`) or on the trigger must ask
//! for a requeue when it wants to be called again; an unchanged cluster does not call it.
//! The fingerprint is 64 bits (SipHash): two different inputs taken for the same have a
//! chance of about 2^-64.

use std::hash::{DefaultHasher, Hash, Hasher};

use crate::contract::{KindObjects, ReconcileRequest};

/// The fingerprint of `request`'s inputs for the module of sha256 `module`.
pub fn fingerprint(request: &ReconcileRequest, module: &str) -> u64 {
    let mut h = DefaultHasher::new();
    module.hash(&mut h);
    request.context.reconciler.hash(&mut h);
    request.context.config.hash(&mut h);
    request.primary.hash(&mut h);
    kinds(&request.owned, &mut h);
    kinds(&request.related, &mut h);
    h.finish()
}

fn kinds(kinds: &[KindObjects], h: &mut DefaultHasher) {
    kinds.len().hash(h);
    for k in kinds {
        k.kind.hash(h);
        k.objects.hash(h);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::{Context, Gvk, Trigger};

    fn request() -> ReconcileRequest {
        ReconcileRequest {
            primary: r#"{"metadata":{"name":"a","resourceVersion":"5"}}"#.into(),
            owned: vec![KindObjects {
                kind: Gvk::new("apps/v1", "Deployment"),
                objects: vec![r#"{"metadata":{"name":"a","resourceVersion":"7"}}"#.into()],
            }],
            related: vec![],
            context: Context {
                reconciler: "r".into(),
                trigger: Trigger::Resync,
                attempt: 1,
                config: "{}".into(),
                now_unix_ms: 1,
            },
        }
    }

    #[test]
    fn the_time_the_trigger_and_the_attempt_are_not_inputs() {
        let mut later = request();
        later.context.now_unix_ms = 99;
        later.context.trigger = Trigger::PrimaryChanged;
        later.context.attempt = 3;
        assert_eq!(fingerprint(&request(), "m"), fingerprint(&later, "m"));
    }

    #[test]
    fn the_primary_a_child_a_related_object_the_config_and_the_module_are() {
        let base = fingerprint(&request(), "m");
        let mut changed = request();
        changed.primary = changed.primary.replace("\"5\"", "\"6\"");
        assert_ne!(base, fingerprint(&changed, "m"));
        let mut child = request();
        child.owned[0].objects.clear();
        assert_ne!(base, fingerprint(&child, "m"));
        let mut related = request();
        related.related.push(KindObjects {
            kind: Gvk::new("v1", "ConfigMap"),
            objects: vec![],
        });
        assert_ne!(base, fingerprint(&related, "m"));
        let mut config = request();
        config.context.config = r#"{"x":1}"#.into();
        assert_ne!(base, fingerprint(&config, "m"));
        assert_ne!(base, fingerprint(&request(), "other"));
    }
}
