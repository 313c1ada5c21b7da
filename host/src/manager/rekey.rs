//! Key rotation: the serving module's signatures checked again when the ConfigMap or Secret
//! holding its policy's key (`spec.module.oci.verify.keyConfigMap` / `keySecret`) changes, or
//! when the spec names another key (`verify.key`, handed over once per spec), on every replica
//! (a sharded follower too, which runs no swap of its own).
//!
//! While a reconciler serves, its supervisor follows that one object
//! ([`signature::key_changes`]) and hands each change to [`recheck`].
//!
//! # Guarantees
//! - A change is checked only when the keys it gives differ from those that verified the
//!   active module (`status.activeModule.verifiedBy`): a relist or an unrelated edit of the
//!   object costs no registry call.
//! - The module's signatures are looked up again (no pull, no compile, no swap) against the new
//!   key set (the host's `--require-signed-modules` key and the new one). A module they verify
//!   keeps serving and `verifiedBy` records the new keys; one they do not verify, or a key
//!   object deleted or holding no usable key, stops serving exactly as a revoked module does
//!   (`Ready=False`, reason `SignatureInvalid` or `SignatureKeyInvalid`, set-up retried).
//! - A registry that cannot be asked keeps the module serving, and the check is retried with
//!   backoff (1 s doubling to 60 s) until it answers or the key changes again.
//!
//! # Caveats
//! - The host's own `--require-signed-modules` key is a file read at start: a change to it takes
//!   effect when the host restarts.
//! - Only the module the spec pins is checked; a module serving after a rollback to an older
//!   one is checked at its next set-up.

use futures::StreamExt;
use futures::stream::BoxStream;
use kube::runtime::events::EventType as KubeEventType;
use tokio::time::Instant;

use super::status::{SetupError, Subject};
use super::swap::{self, Kept, SwapState};
use crate::crd::VerifiedKey;
use crate::modules::oci;
use crate::modules::registry::Pinned;
use crate::modules::signature::{self, KeyChange, SignatureError, TrustedKey};
use crate::reasons;

/// A re-check waiting for its retry: the registry could not be asked.
pub(super) struct Pending {
    key: TrustedKey,
    at: Instant,
    attempts: u32,
}

/// The key changes of `s`'s current policy, as [`signature::key_changes`] gives them.
pub(super) fn changes(s: &Subject) -> BoxStream<'static, KeyChange> {
    let policy =
        s.wr.spec
            .module
            .oci
            .as_ref()
            .and_then(|o| o.verify.as_ref());
    match policy {
        Some(policy) => signature::key_changes(&s.ctx.client, &s.ctx.oci.namespace(), policy),
        None => futures::stream::pending().boxed(),
    }
}

/// Checks the serving module against the key `change` gives (after `attempts` retries). Sets
/// `state.revoked` when the module must stop serving, `pending` when the registry could not be
/// asked.
pub(super) async fn recheck(
    s: &mut Subject,
    kept: &mut Kept,
    change: KeyChange,
    attempts: u32,
    state: &mut SwapState,
    pending: &mut Option<Pending>,
) {
    *pending = None;
    let key = match change {
        Ok(key) => key,
        Err(e) => return revoke_if_serving(s, state, &e),
    };
    let Some(pinned) = serving_pinned(s) else {
        return;
    };
    let mut keys: Vec<TrustedKey> = s.ctx.oci.required_key.iter().cloned().collect();
    keys.push(key.clone());
    let recorded: Vec<VerifiedKey> = keys.iter().map(TrustedKey::recorded).collect();
    if same_keys(s, &recorded) {
        return;
    }
    match check(s, &pinned, &keys).await {
        Ok(()) => verified(s, kept, &pinned, recorded).await,
        Err(e @ SignatureError::Lookup { .. }) => {
            let delay = swap::deferral_backoff(attempts);
            tracing::warn!(reconciler = %s.name(), error = %e, "its signing key changed and its signatures cannot be looked up: the module keeps serving, checked again in {delay:?}");
            *pending = Some(Pending {
                key,
                at: Instant::now() + delay,
                attempts: attempts.saturating_add(1),
            });
        }
        Err(e) => revoke_if_serving(s, state, &e),
    }
}

/// Retries the re-check `pending` holds once it is due.
pub(super) async fn retry_due(
    s: &mut Subject,
    kept: &mut Kept,
    state: &mut SwapState,
    pending: &mut Option<Pending>,
) {
    let due = pending.take_if(|p| p.at <= Instant::now());
    if let Some(p) = due {
        recheck(s, kept, Ok(p.key), p.attempts, state, pending).await;
    }
}

/// The module the spec pins, when it is the one serving.
fn serving_pinned(s: &Subject) -> Option<Pinned> {
    let pinned = oci::pin(s.wr.spec.module.oci.as_ref()?).ok()?;
    let serving = s.status.active_module.as_ref()?.origin.as_deref()?;
    (pinned.origin() == serving).then_some(pinned)
}

/// Whether `keys` are the keys that verified the active module (by fingerprint).
fn same_keys(s: &Subject, keys: &[VerifiedKey]) -> bool {
    let fingerprints = |keys: &[VerifiedKey]| {
        let mut f: Vec<String> = keys.iter().map(|k| k.fingerprint.clone()).collect();
        f.sort();
        f
    };
    let active = s.status.active_module.as_ref();
    active.is_some_and(|a| fingerprints(&a.verified_by) == fingerprints(keys))
}

/// Looks the signatures of `pinned` up again, with the credentials the spec names.
async fn check(s: &Subject, pinned: &Pinned, keys: &[TrustedKey]) -> Result<(), SignatureError> {
    let lookup = |detail: String| SignatureError::Lookup {
        reference: pinned.reference.whole(),
        digest: pinned.digest.clone(),
        detail,
    };
    let spec =
        s.wr.spec
            .module
            .oci
            .as_ref()
            .ok_or_else(|| lookup("no OCI module".into()))?;
    let registry = pinned.reference.resolve_registry().to_string();
    let access = oci::access(&s.ctx.client, &s.ctx.oci.namespace(), spec, &registry)
        .await
        .map_err(|e| lookup(e.to_string()))?;
    signature::verify(pinned, &access, keys).await
}

/// Records that `keys` verified the serving module `pinned`, with a Normal Event.
async fn verified(s: &mut Subject, kept: &mut Kept, pinned: &Pinned, keys: Vec<VerifiedKey>) {
    let names: Vec<String> = keys
        .iter()
        .map(|k| format!("{} ({})", k.fingerprint, k.source))
        .collect();
    let message = format!(
        "the signing key changed; {} is signed by key {}: it keeps serving",
        pinned.reference.whole(),
        names.join(", ")
    );
    tracing::info!(reconciler = %s.name(), "{message}");
    let Some(active) = &mut s.status.active_module else {
        return;
    };
    kept.verified(&active.sha256, &keys);
    active.verified_by = keys;
    s.write_status().await;
    s.event_on_wr(KubeEventType::Normal, reasons::SIGNATURE_VERIFIED, &message)
        .await;
}

/// Stops the serving module (`state.revoked`) for signature failure `e`, when it refuses the
/// very module serving ([`swap::revokes`]).
fn revoke_if_serving(s: &Subject, state: &mut SwapState, e: &SignatureError) {
    let e = SetupError {
        reason: e.reason(),
        message: format!("the signing key changed: {e}"),
    };
    if swap::revokes(s, &e) {
        state.revoked = Some(e);
    } else {
        tracing::warn!(reconciler = %s.name(), reason = e.reason, "{}", e.message);
    }
}
