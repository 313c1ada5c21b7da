//! Every condition type and every reason the host writes: on the WasmReconciler's conditions,
//! on Events (on the WasmReconciler, its module ConfigMap and its primaries).
//!
//! Users match on these strings (alerts, `kubectl get events --field-selector reason=...`), so
//! they are API: each is named here once, and the table "Reasons" in docs/operating.md lists
//! exactly these ([`ALL`]; a unit test compares the two). Reasons a module chooses for its own
//! Events and conditions are the module's, not listed here.
//!
//! This module imports nothing of the crate, so every floor may use it.

/// Declares each reason as a constant, and [`ALL`] with every one in order.
macro_rules! reasons {
    ($( $(#[$doc:meta])* $name:ident = $value:literal; )*) => {
        $( $(#[$doc])* pub const $name: &str = $value; )*

        /// Every condition type and reason of this module, as docs/operating.md lists them.
        pub const ALL: &[&str] = &[$($name),*];
    };
}

reasons! {
    // Condition types of the WasmReconciler.

    /// Condition type: the reconciler's controller runs and reconciles.
    READY = "Ready";
    /// Condition type: the module named by the spec is the one serving.
    MODULE_LOADED = "ModuleLoaded";
    /// Condition type: some of the module's writes are refused by RBAC.
    DEGRADED = "Degraded";

    // Serving (conditions True, Normal Events on the WasmReconciler).

    /// `Ready=True`: the controller watches and reconciles its primaries.
    RECONCILING = "Reconciling";
    /// `Degraded=False`: no write of the module is refused.
    ALL_WRITES_ALLOWED = "AllWritesAllowed";
    /// `ModuleLoaded=True` and a Normal Event: the first module serves.
    STARTED = "Started";
    /// `ModuleLoaded=True` and a Normal Event: a new module replaced the previous one.
    MODULE_SWAPPED = "ModuleSwapped";
    /// `ModuleLoaded=True`: the spec names the module already serving (an earlier refusal is
    /// cleared).
    MODULE_UNCHANGED = "ModuleUnchanged";
    /// A Normal Event: every watch lists and watches again after `WatchFailed`.
    WATCHES_SYNCED = "WatchesSynced";

    // The reconciler cannot start or serve (`Ready=False`, Warning Events).

    /// A field of the WasmReconciler is wrong (a duration, a quantity, a scope).
    INVALID_SPEC = "InvalidSpec";
    /// A kind the spec names is not served by the API server.
    KIND_NOT_SERVED = "KindNotServed";
    /// An earlier WasmReconciler serves the same primaries.
    CONFLICT = "Conflict";
    /// The WasmReconcilers could not be listed to rule out a conflict.
    CONFLICT_CHECK_FAILED = "ConflictCheckFailed";
    /// The module's ServiceAccount may not list/watch a kind the reconciler reads.
    READ_NOT_ALLOWED = "ReadNotAllowed";
    /// The host could not ask whether the module's ServiceAccount may read its kinds.
    ACCESS_CHECK_FAILED = "AccessCheckFailed";
    /// The client impersonating the module's ServiceAccount could not be built.
    CLIENT_ERROR = "ClientError";
    /// A watch of the reconciler cannot list or watch.
    WATCH_FAILED = "WatchFailed";
    /// A bug in the host stopped the reconciler (a panic).
    INTERNAL_ERROR = "InternalError";
    /// `Degraded=True`, and a Warning Event on a primary: a write was refused by RBAC.
    FORBIDDEN = "Forbidden";

    // The module is refused (`ModuleLoaded=False`, Warning Events on the WasmReconciler and the
    // module ConfigMap).

    /// The module's ConfigMap or key is missing.
    MODULE_UNAVAILABLE = "ModuleUnavailable";
    /// Not a reconciler component of this host's contract, or not Wasm at all.
    MODULE_INVALID = "ModuleInvalid";
    /// The module is not the one `spec.module.sha256` (or the OCI digest) pins.
    DIGEST_MISMATCH = "DigestMismatch";
    /// The module's metadata do not fit the WasmReconciler's kinds.
    MODULE_MISMATCH = "ModuleMismatch";
    /// The source holds a rolled-back module and no copy of the last good one can be read.
    MODULE_REJECTED = "ModuleRejected";
    /// The new module failed its dry run over existing primaries.
    SELF_CHECK_FAILED = "SelfCheckFailed";
    /// The new module failed too often after the swap and was rolled back.
    ROLLED_BACK = "RolledBack";
    /// The host had no sandbox (or cache) to spare to load the module: not the module's fault.
    HOST_BUSY = "HostBusy";
    /// The host requires signed modules and a ConfigMap cannot carry a signature.
    SIGNATURE_REQUIRED = "SignatureRequired";
    /// The module's signature is missing or made with another key.
    SIGNATURE_INVALID = "SignatureInvalid";
    /// The key modules must be signed with cannot be used.
    SIGNATURE_KEY_INVALID = "SignatureKeyInvalid";
    /// The host died while compiling the module, repeatedly: it is refused until another module
    /// is pushed or its quarantine markers are deleted.
    MODULE_QUARANTINED = "ModuleQuarantined";
    /// Event: the key of the signing policy changed, and the serving module's signatures
    /// verify with the new key: it keeps serving.
    SIGNATURE_VERIFIED = "SignatureVerified";
    /// The OCI registry cannot be reached.
    REGISTRY_UNREACHABLE = "RegistryUnreachable";
    /// The OCI registry refused the host's credentials.
    REGISTRY_UNAUTHORIZED = "RegistryUnauthorized";
    /// The OCI registry credentials (the pull Secret) cannot be read or used.
    REGISTRY_CREDENTIALS_INVALID = "RegistryCredentialsInvalid";
    /// The OCI registry answered with an error.
    REGISTRY_ERROR = "RegistryError";
    /// The OCI reference names no module.
    MODULE_NOT_FOUND = "ModuleNotFound";

    // The Ready condition of a Metacontroller Composite- or DecoratorController wasmop serves.

    /// `Ready=True`: a WasmReconciler serves the controller (its own conditions say how).
    SERVED = "Served";
    /// `Ready=False`: the controller uses a feature wasmop does not serve (the message names
    /// the field); it is not served at all.
    UNSUPPORTED = "Unsupported";
    /// `Ready=False`: a WasmReconciler of the name wasmop gives this controller's exists and is
    /// not this controller's.
    NAME_TAKEN = "NameTaken";

    // Warning Events on the WasmReconciler.

    /// The self-check of a new module could not run (cluster or host); retried.
    SELF_CHECK_DEFERRED = "SelfCheckDeferred";
    /// Finalizers of a deleted or narrowed reconciler could not be removed yet; retried.
    RELEASE_FAILED = "ReleaseFailed";

    // Warning Events on primaries.

    /// The host removed a reconciler's finalizer from a primary it no longer serves.
    FINALIZER_RELEASED = "FinalizerReleased";
    /// Finalize reported done but some of its writes failed.
    FINALIZE_INCOMPLETE = "FinalizeIncomplete";
    /// The module asked for something outside its grant.
    INVALID_INTENTS = "InvalidIntents";
    /// The API server refused an intent.
    APPLY_FAILED = "ApplyFailed";
    /// The module's inputs could not fit in its memory: it was not called.
    INPUTS_TOO_LARGE = "InputsTooLarge";
    /// The module returned an error.
    MODULE_ERROR = "ModuleError";
    /// The module panicked.
    MODULE_PANICKED = "ModulePanicked";
    /// The module trapped.
    MODULE_TRAPPED = "ModuleTrapped";
    /// The module's output is not valid JSON of the contract.
    MODULE_OUTPUT_MALFORMED = "ModuleOutputMalformed";
    /// The module's output is larger than the cap.
    MODULE_OUTPUT_TOO_LARGE = "ModuleOutputTooLarge";
    /// The call hit `limits.deadline`.
    MODULE_DEADLINE_EXCEEDED = "ModuleDeadlineExceeded";
    /// The call hit `limits.memory`.
    MODULE_MEMORY_EXCEEDED = "ModuleMemoryExceeded";
    /// No sandbox could be made for the call.
    SANDBOX_UNAVAILABLE = "SandboxUnavailable";
    /// No sandbox was free within the call's deadline.
    SANDBOX_BUSY = "SandboxBusy";
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// The first column of the table under `## Reasons` in docs/operating.md.
    fn documented() -> Vec<String> {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/operating.md");
        let text =
            std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"));
        let section = text
            .split("\n## Reasons\n")
            .nth(1)
            .unwrap_or_else(|| panic!("{path} has no `## Reasons` section"));
        let section = section.split("\n## ").next().unwrap_or_default();
        section
            .lines()
            .filter_map(|l| l.strip_prefix("| `"))
            .filter_map(|l| l.split('`').next())
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn every_reason_is_named_once() {
        let unique: BTreeSet<&str> = ALL.iter().copied().collect();
        assert_eq!(unique.len(), ALL.len(), "a reason is declared twice");
        for r in ALL {
            assert!(
                !r.is_empty() && r.chars().all(|c| c.is_ascii_alphanumeric()),
                "{r:?} is not a CamelCase reason"
            );
            assert!(r.starts_with(|c: char| c.is_ascii_uppercase()), "{r:?}");
        }
    }

    #[test]
    fn the_reasons_table_in_operating_md_lists_exactly_these() {
        let doc = documented();
        let in_doc: BTreeSet<&str> = doc.iter().map(String::as_str).collect();
        assert_eq!(
            in_doc.len(),
            doc.len(),
            "a reason is listed twice in docs/operating.md"
        );
        let in_code: BTreeSet<&str> = ALL.iter().copied().collect();
        let missing: Vec<_> = in_code.difference(&in_doc).collect();
        let unknown: Vec<_> = in_doc.difference(&in_code).collect();
        assert!(
            missing.is_empty() && unknown.is_empty(),
            "docs/operating.md `## Reasons` and host/src/reasons.rs differ: not documented {missing:?}, not in the code {unknown:?}"
        );
    }
}
