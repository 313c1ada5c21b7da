//! What a module answers: intents.

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::{Error, Gvk, ObjectRef, Request, Result};

/// How a delete propagates to the object's dependents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Propagation {
    /// Delete now; the garbage collector deletes dependents afterwards.
    Background,
    /// Dependents first, then the object.
    Foreground,
    /// Leave dependents in place.
    Orphan,
}

/// An imperative intent, applied in order after the children.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// An RFC 7386 merge patch (a JSON object).
    MergePatch {
        /// The patched object.
        target: ObjectRef,
        /// The patch.
        patch: serde_json::Value,
    },
    /// An RFC 6902 JSON patch (an array of operations).
    JsonPatch {
        /// The patched object.
        target: ObjectRef,
        /// The operations.
        patch: serde_json::Value,
    },
    /// A delete.
    Delete {
        /// The deleted object.
        target: ObjectRef,
        /// How dependents are treated.
        propagation: Propagation,
    },
}

/// A condition's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ConditionStatus {
    /// `"True"`.
    True,
    /// `"False"`.
    False,
    /// `"Unknown"`.
    Unknown,
}

/// A status condition; the host adds `lastTransitionTime` and `observedGeneration`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    /// `Available`, `Progressing`, `Ready`...
    pub type_: String,
    /// True, False or Unknown.
    pub status: ConditionStatus,
    /// CamelCase reason.
    pub reason: String,
    /// Human-readable message.
    pub message: String,
}

impl Condition {
    /// A condition `type_` that is true (`status: bool`) or false.
    pub fn new(type_: impl Into<String>, status: bool) -> Self {
        Condition {
            type_: type_.into(),
            status: if status {
                ConditionStatus::True
            } else {
                ConditionStatus::False
            },
            reason: String::new(),
            message: String::new(),
        }
    }

    /// A condition whose status is Unknown.
    pub fn unknown(type_: impl Into<String>) -> Self {
        Condition {
            status: ConditionStatus::Unknown,
            ..Condition::new(type_, false)
        }
    }

    /// Sets the CamelCase reason.
    pub fn reason(mut self, reason: impl Into<String>) -> Self {
        self.reason = reason.into();
        self
    }

    /// Sets the message.
    pub fn message(mut self, message: impl Into<String>) -> Self {
        self.message = message.into();
        self
    }
}

/// The whole status of the primary, as the module wants it.
#[derive(Debug, Clone, PartialEq)]
pub struct Status {
    /// The status fields other than `conditions` and `observedGeneration` (a JSON object).
    pub fields: serde_json::Value,
    /// The conditions.
    pub conditions: Vec<Condition>,
}

/// Normal or Warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventType {
    /// Something expected happened.
    Normal,
    /// Something a person should look at.
    Warning,
}

/// A Kubernetes Event (repeats are counted by the host, not duplicated).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Normal or Warning.
    pub type_: EventType,
    /// CamelCase reason.
    pub reason: String,
    /// Human-readable note.
    pub message: String,
    /// CamelCase action (`Reconcile` when empty).
    pub action: String,
    /// What the event is about (None: the primary).
    pub regarding: Option<ObjectRef>,
}

impl Event {
    /// A Normal event.
    pub fn normal(reason: impl Into<String>, message: impl Into<String>) -> Self {
        Event {
            type_: EventType::Normal,
            reason: reason.into(),
            message: message.into(),
            action: String::new(),
            regarding: None,
        }
    }

    /// A Warning event.
    pub fn warning(reason: impl Into<String>, message: impl Into<String>) -> Self {
        Event {
            type_: EventType::Warning,
            ..Event::normal(reason, message)
        }
    }

    /// Sets the action.
    pub fn action(mut self, action: impl Into<String>) -> Self {
        self.action = action.into();
        self
    }

    /// About another object than the primary.
    pub fn regarding(mut self, object: ObjectRef) -> Self {
        self.regarding = Some(object);
        self
    }
}

/// The intents of one reconcile. Build it with the chaining methods; a serialization error in
/// any of them is kept and returned when the response is handed to the host.
#[derive(Debug, Clone, Default)]
pub struct Response {
    pub(crate) children: Vec<(Gvk, Vec<String>)>,
    pub(crate) actions: Vec<Action>,
    pub(crate) status: Option<Status>,
    pub(crate) events: Vec<Event>,
    pub(crate) requeue_after: Option<Duration>,
    pub(crate) error: Option<Error>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TypeMeta {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
}

impl Response {
    /// An empty response: no children are applied, nothing is pruned, the status is untouched.
    pub fn new() -> Self {
        Response::default()
    }

    /// A declarative response: every kind the module owns is a complete set, initially empty, so
    /// every existing child you do not add with [`Response::child`] is pruned. This is what most
    /// modules want.
    pub fn complete(request: &Request) -> Self {
        let mut r = Response::new();
        for (kind, _) in &request.owned {
            r.set_of(kind.clone());
        }
        r
    }

    fn set_of(&mut self, kind: Gvk) -> &mut Vec<String> {
        let i = match self.children.iter().position(|(k, _)| *k == kind) {
            Some(i) => i,
            None => {
                self.children.push((kind, Vec::new()));
                self.children.len() - 1
            }
        };
        &mut self.children[i].1
    }

    /// Declares the complete set of children of `kind` empty (all pruned), unless children of
    /// that kind are added.
    pub fn none_of(mut self, kind: Gvk) -> Self {
        self.set_of(kind);
        self
    }

    /// Adds a desired child of a k8s-openapi kind (its namespace defaults to the primary's).
    pub fn child<K: k8s_openapi::Resource + Serialize>(mut self, object: &K) -> Self {
        match serde_json::to_string(object) {
            Ok(json) => self.set_of(Gvk::of::<K>()).push(json),
            Err(e) => self.keep_error(Error::msg(e).context(format!("serializing a {}", K::KIND))),
        }
        self
    }

    /// Adds a desired child given as any serializable value with `apiVersion` and `kind`.
    pub fn child_value(mut self, object: &impl Serialize) -> Self {
        let json = match serde_json::to_string(object) {
            Ok(json) => json,
            Err(e) => {
                self.keep_error(Error::msg(e).context("serializing a child"));
                return self;
            }
        };
        match serde_json::from_str::<TypeMeta>(&json) {
            Ok(t) if !t.api_version.is_empty() && !t.kind.is_empty() => {
                self.set_of(Gvk::new(t.api_version, t.kind)).push(json)
            }
            Ok(_) => self.keep_error(Error::msg("a child has no apiVersion or kind")),
            Err(e) => self.keep_error(Error::msg(e).context("a child is not a JSON object")),
        }
        self
    }

    /// Adds a merge patch of `target`.
    pub fn merge_patch(mut self, target: ObjectRef, patch: serde_json::Value) -> Self {
        self.actions.push(Action::MergePatch { target, patch });
        self
    }

    /// Adds a JSON patch of `target`.
    pub fn json_patch(mut self, target: ObjectRef, patch: serde_json::Value) -> Self {
        self.actions.push(Action::JsonPatch { target, patch });
        self
    }

    /// Deletes `target`.
    pub fn delete(mut self, target: ObjectRef, propagation: Propagation) -> Self {
        self.actions.push(Action::Delete {
            target,
            propagation,
        });
        self
    }

    /// Sets the status fields (other than conditions and observedGeneration).
    pub fn status(mut self, fields: &impl Serialize) -> Self {
        match serde_json::to_value(fields) {
            Ok(v @ serde_json::Value::Object(_)) => self.status_mut().fields = v,
            Ok(_) => self.keep_error(Error::msg("the status must serialize to a JSON object")),
            Err(e) => self.keep_error(Error::msg(e).context("serializing the status")),
        }
        self
    }

    /// Adds (or replaces, by type) a status condition.
    pub fn condition(mut self, condition: Condition) -> Self {
        let conditions = &mut self.status_mut().conditions;
        conditions.retain(|c| c.type_ != condition.type_);
        conditions.push(condition);
        self
    }

    fn status_mut(&mut self) -> &mut Status {
        self.status.get_or_insert_with(|| Status {
            fields: serde_json::Value::Object(Default::default()),
            conditions: Vec::new(),
        })
    }

    /// Records an Event.
    pub fn event(mut self, event: Event) -> Self {
        self.events.push(event);
        self
    }

    /// Asks to be reconciled again after `after`, even if nothing changes.
    pub fn requeue_after(mut self, after: Duration) -> Self {
        self.requeue_after = Some(after);
        self
    }

    fn keep_error(&mut self, e: Error) {
        if self.error.is_none() {
            self.error = Some(e);
        }
    }

    /// The children of the k8s-openapi kind `K` (for tests).
    ///
    /// # Errors
    /// If a child does not parse as `K`.
    pub fn children<K: k8s_openapi::Resource + DeserializeOwned>(&self) -> Result<Vec<K>> {
        self.children_as(&Gvk::of::<K>())
    }

    /// The children of `kind`, parsed as `T` (for tests).
    ///
    /// # Errors
    /// If a child does not parse as `T`.
    pub fn children_as<T: DeserializeOwned>(&self, kind: &Gvk) -> Result<Vec<T>> {
        self.children
            .iter()
            .filter(|(k, _)| k == kind)
            .flat_map(|(_, objects)| objects.iter())
            .map(|json| serde_json::from_str(json).map_err(Error::from))
            .collect()
    }

    /// Every child set: kind and objects as JSON text.
    pub fn child_sets(&self) -> &[(Gvk, Vec<String>)] {
        &self.children
    }

    /// The imperative intents.
    pub fn actions(&self) -> &[Action] {
        &self.actions
    }

    /// The status, if set.
    pub fn status_ref(&self) -> Option<&Status> {
        self.status.as_ref()
    }

    /// The status condition of this type, if set.
    pub fn condition_of(&self, type_: &str) -> Option<&Condition> {
        self.status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
    }

    /// The Events.
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// The requeue delay, if set.
    pub fn requeue(&self) -> Option<Duration> {
        self.requeue_after
    }

    /// The first serialization error kept by a builder method, if any.
    pub fn error(&self) -> Option<&Error> {
        self.error.as_ref()
    }
}

/// The result of a finalize: done, or pending (called again later), with side effects.
#[derive(Debug, Clone, Default)]
pub struct Finalized {
    /// Whether clean-up is complete (the host then removes its finalizer).
    pub done: bool,
    /// Actions, status, Events and a requeue delay; children are not allowed here.
    pub effects: Response,
}

impl Finalized {
    /// Clean-up is complete.
    pub fn done() -> Self {
        Finalized {
            done: true,
            effects: Response::new(),
        }
    }

    /// Clean-up is not complete; finalize runs again (set a delay with the effects' requeue).
    pub fn pending() -> Self {
        Finalized {
            done: false,
            effects: Response::new(),
        }
    }

    /// With these actions, status, Events and requeue delay.
    pub fn with(mut self, effects: Response) -> Self {
        self.effects = effects;
        self
    }
}

/// The verdict on a proposed change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Validation {
    /// Allowed, with warnings for the user (maybe none).
    Allowed(Vec<String>),
    /// Refused.
    Denied {
        /// Why, for the person who made the change.
        message: String,
        /// The offending field (`spec.version`), when there is one.
        field: Option<String>,
    },
}

impl Validation {
    /// Allowed.
    pub fn allow() -> Self {
        Validation::Allowed(Vec::new())
    }

    /// Allowed, with a warning.
    pub fn warn(self, warning: impl Into<String>) -> Self {
        match self {
            Validation::Allowed(mut w) => {
                w.push(warning.into());
                Validation::Allowed(w)
            }
            denied => denied,
        }
    }

    /// Refused, with a message.
    pub fn deny(message: impl Into<String>) -> Self {
        Validation::Denied {
            message: message.into(),
            field: None,
        }
    }

    /// Refused because of `field` (a JSON path such as `spec.version`).
    pub fn deny_field(field: impl Into<String>, message: impl Into<String>) -> Self {
        Validation::Denied {
            message: message.into(),
            field: Some(field.into()),
        }
    }

    /// Whether the change is allowed.
    pub fn is_allowed(&self) -> bool {
        matches!(self, Validation::Allowed(_))
    }
}
