//! Unit-testing a reconciler natively, with plain `cargo test` and no Wasm.
//!
//! ```ignore
//! use wasmop_sdk::testing::Harness;
//! let out = Harness::<MyReconciler>::new()
//!     .primary_yaml(include_str!("../fixtures/cr.yaml"))
//!     .observed_yaml(include_str!("../fixtures/observed/deployment.yaml"))
//!     .reconcile()?;
//! assert_eq!(out.children::<Deployment>()?.len(), 1);
//! ```
//!
//! # Guarantees
//! The harness hands the reconciler the same [`Request`] the host would build (every owned kind
//! present, observed objects grouped by kind) and checks what the host's intent validation checks
//! first: every child is of a kind the metadata owns and has a name. It does not check against a
//! cluster (RBAC, schemas); `wasmop test` and the end-to-end tests do more.
//!
//! # Panics
//! Builder methods panic with a clear message on malformed fixtures: this is test code.

use std::marker::PhantomData;

use serde::Serialize;
use serde_json::Value;

use crate::log::Level;
use crate::{
    Context, Error, Finalized, Gvk, Metadata, Operation, Reconciler, Request, Response, Result,
    Trigger, ValidateRequest, Validation,
};

/// Builds a request for reconciler `R` and runs it natively.
#[derive(Debug)]
pub struct Harness<R> {
    metadata: Metadata,
    primary: Option<String>,
    owned: Vec<(Gvk, Vec<String>)>,
    related: Vec<(Gvk, Vec<String>)>,
    context: Context,
    logs: std::cell::RefCell<Vec<(Level, String)>>,
    _reconciler: PhantomData<R>,
}

impl<R: Reconciler> Default for Harness<R> {
    fn default() -> Self {
        Self::new()
    }
}

/// Parses one or more YAML documents into JSON values.
///
/// # Panics
/// If the text is not YAML.
pub fn yaml_documents(yaml: &str) -> Vec<Value> {
    match serde_saphyr::from_str_multiple::<Value, Vec<Value>>(yaml) {
        Ok(docs) => docs.into_iter().filter(|d| !d.is_null()).collect(),
        Err(e) => panic!("the fixture is not valid YAML: {e}"),
    }
}

fn kind_of(v: &Value) -> Gvk {
    let get = |k: &str| {
        v.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let gvk = Gvk::new(get("apiVersion"), get("kind"));
    assert!(
        !gvk.api_version.is_empty() && !gvk.kind.is_empty(),
        "a fixture object has no apiVersion or kind: {v}"
    );
    gvk
}

impl<R: Reconciler> Harness<R> {
    /// A harness whose request lists every owned and related kind of `R`, with no objects.
    pub fn new() -> Self {
        let metadata = R::metadata();
        let owned = metadata
            .owns
            .iter()
            .map(|k| (k.clone(), Vec::new()))
            .collect();
        let related = metadata
            .related
            .iter()
            .map(|r| (r.kind.clone(), Vec::new()))
            .collect();
        Harness {
            metadata,
            primary: None,
            owned,
            related,
            context: Context::default(),
            logs: Default::default(),
            _reconciler: PhantomData,
        }
    }

    /// The primary object, as JSON text.
    pub fn primary_json(mut self, json: &str) -> Self {
        self.primary = Some(json.to_string());
        self
    }

    /// The primary object, as YAML text.
    pub fn primary_yaml(self, yaml: &str) -> Self {
        let mut docs = yaml_documents(yaml);
        assert_eq!(
            docs.len(),
            1,
            "the primary fixture must be one YAML document"
        );
        let doc = docs.remove(0);
        self.primary_json(&doc.to_string())
    }

    /// The primary object, from any serializable value.
    pub fn primary(self, object: &impl Serialize) -> Self {
        match serde_json::to_string(object) {
            Ok(json) => self.primary_json(&json),
            Err(e) => panic!("the primary does not serialize: {e}"),
        }
    }

    /// An observed object: an owned child or a related object, by its kind.
    ///
    /// When a kind is both owned and related (a propagator owns its copies and reads its
    /// source, both ConfigMaps), the object goes where the host would put it: with the owned
    /// children if it has a controller ownerReference, with the related objects otherwise.
    ///
    /// # Panics
    /// If its kind is neither owned nor related by the metadata.
    pub fn observed(mut self, object: &impl Serialize) -> Self {
        let value = match serde_json::to_value(object) {
            Ok(v) => v,
            Err(e) => panic!("an observed object does not serialize: {e}"),
        };
        let kind = kind_of(&value);
        let json = value.to_string();
        let related_too = self.related.iter().any(|(k, _)| *k == kind);
        let owned_slot = self
            .owned
            .iter_mut()
            .find(|(k, _)| *k == kind)
            .filter(|_| !related_too || has_controller(&value));
        if let Some((_, objects)) = owned_slot {
            objects.push(json);
        } else if let Some((_, objects)) = self.related.iter_mut().find(|(k, _)| *k == kind) {
            objects.push(json);
        } else {
            panic!(
                "observed object of kind {kind} is neither owned nor related by module {}",
                self.metadata.name
            );
        }
        self
    }

    /// Observed objects from YAML text (one or more documents).
    pub fn observed_yaml(mut self, yaml: &str) -> Self {
        for doc in yaml_documents(yaml) {
            self = self.observed(&doc);
        }
        self
    }

    /// The WasmReconciler's config.
    pub fn config(mut self, config: Value) -> Self {
        self.context.config = config.to_string();
        self
    }

    /// The trigger.
    pub fn trigger(mut self, trigger: Trigger) -> Self {
        self.context.trigger = trigger;
        self
    }

    /// The attempt number.
    pub fn attempt(mut self, attempt: u32) -> Self {
        self.context.attempt = attempt;
        self
    }

    /// The host's time, in milliseconds since the Unix epoch.
    pub fn now_unix_ms(mut self, now: u64) -> Self {
        self.context.now_unix_ms = now;
        self
    }

    /// The request the reconciler will get.
    ///
    /// # Panics
    /// If no primary was given.
    pub fn request(&self) -> Request {
        let primary = self
            .primary
            .clone()
            .unwrap_or_else(|| panic!("give the harness a primary object first"));
        Request::from_parts(
            primary,
            self.owned.clone(),
            self.related.clone(),
            self.context.clone(),
        )
    }

    /// Runs reconcile and checks its children.
    ///
    /// # Errors
    /// The reconciler's error, a builder's serialization error, or a child that the host would
    /// refuse (an undeclared kind, no name).
    pub fn reconcile(&self) -> Result<Response> {
        let request = self.request();
        let (out, logs) = crate::log::native::capture(|| R::reconcile(&request));
        self.logs.borrow_mut().extend(logs);
        let out = out?;
        if let Some(e) = out.error() {
            return Err(e.clone());
        }
        for (kind, objects) in out.child_sets() {
            if !self.metadata.owns.contains(kind) {
                return Err(Error::msg(format!(
                    "the response has children of kind {kind}, which the module does not declare it owns"
                )));
            }
            for json in objects {
                let v: Value = serde_json::from_str(json)?;
                let name = v
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                if name.is_empty() {
                    return Err(Error::msg(format!(
                        "a child of kind {kind} has no metadata.name"
                    )));
                }
            }
        }
        Ok(out)
    }

    /// Runs finalize.
    ///
    /// # Errors
    /// The reconciler's error, or a builder's serialization error.
    pub fn finalize(&self) -> Result<Finalized> {
        let request = self.request();
        let (out, logs) = crate::log::native::capture(|| R::finalize(&request));
        self.logs.borrow_mut().extend(logs);
        let out = out?;
        if let Some(e) = out.effects.error() {
            return Err(e.clone());
        }
        Ok(out)
    }

    /// Runs validate for the creation of the primary.
    pub fn validate_create(&self) -> Validation {
        let request = ValidateRequest::from_parts(
            Operation::Create,
            None,
            self.request().primary,
            self.context.config.clone(),
        );
        R::validate(&request)
    }

    /// Runs validate for a change of the primary from `old` (YAML) to the harness's primary.
    pub fn validate_update_from_yaml(&self, old: &str) -> Validation {
        let mut docs = yaml_documents(old);
        assert_eq!(docs.len(), 1, "the old object must be one YAML document");
        let old = docs.remove(0).to_string();
        let request = ValidateRequest::from_parts(
            Operation::Update,
            Some(old),
            self.request().primary,
            self.context.config.clone(),
        );
        R::validate(&request)
    }

    /// Runs validate for a change from `old` to `new` (any serializable values).
    pub fn validate_update(&self, old: &impl Serialize, new: &impl Serialize) -> Validation {
        let json = |v: &dyn erased::Ser| v.json();
        let request = ValidateRequest::from_parts(
            Operation::Update,
            Some(json(old)),
            json(new),
            self.context.config.clone(),
        );
        R::validate(&request)
    }

    /// The lines the module logged so far.
    pub fn logs(&self) -> Vec<(Level, String)> {
        self.logs.borrow().clone()
    }
}

mod erased {
    pub trait Ser {
        fn json(&self) -> String;
    }
    impl<T: serde::Serialize> Ser for T {
        fn json(&self) -> String {
            serde_json::to_string(self).unwrap_or_else(|e| panic!("does not serialize: {e}"))
        }
    }
}

/// Whether an object has a controller ownerReference.
fn has_controller(object: &Value) -> bool {
    object["metadata"]["ownerReferences"]
        .as_array()
        .is_some_and(|refs| refs.iter().any(|r| r["controller"] == true))
}
