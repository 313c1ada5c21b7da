//! Conversions between the WIT bindings and the host's contract types.
//!
//! # Errors
//! Output conversions fail with [`CallError::Malformed`] naming the offending part, or
//! [`CallError::OutputTooLarge`] before anything is parsed.

use std::time::Duration;

use serde_json::Value;

use super::bindings::wasmop::reconciler::types as wit;
use super::error::CallError;
use crate::contract as c;

fn gvk_in(g: &c::Gvk) -> wit::Gvk {
    wit::Gvk {
        api_version: g.api_version.clone(),
        kind: g.kind.clone(),
    }
}

fn gvk_out(g: wit::Gvk) -> c::Gvk {
    c::Gvk::new(g.api_version, g.kind)
}

fn ref_in(r: &c::ObjectRef) -> wit::ObjectRef {
    wit::ObjectRef {
        api_version: r.api_version.clone(),
        kind: r.kind.clone(),
        namespace: r.namespace.clone(),
        name: r.name.clone(),
    }
}

fn ref_out(r: wit::ObjectRef) -> c::ObjectRef {
    c::ObjectRef {
        api_version: r.api_version,
        kind: r.kind,
        namespace: r.namespace,
        name: r.name,
    }
}

pub(crate) fn metadata_out(m: wit::ModuleMetadata) -> c::ModuleMetadata {
    c::ModuleMetadata {
        name: m.name,
        version: m.version,
        primary: gvk_out(m.primary),
        owns: m.owns.into_iter().map(gvk_out).collect(),
        related: m
            .related
            .into_iter()
            .map(|r| c::RelatedKind {
                kind: gvk_out(r.kind),
                selector: c::Selector {
                    match_labels: r.selector.match_labels.into_iter().collect(),
                    match_expressions: r
                        .selector
                        .match_expressions
                        .into_iter()
                        .map(|e| c::SelectorRequirement {
                            key: e.key,
                            operator: match e.operator {
                                wit::SelectorOperator::In => c::SelectorOperator::In,
                                wit::SelectorOperator::NotIn => c::SelectorOperator::NotIn,
                                wit::SelectorOperator::Exists => c::SelectorOperator::Exists,
                                wit::SelectorOperator::DoesNotExist => {
                                    c::SelectorOperator::DoesNotExist
                                }
                            },
                            values: e.values,
                        })
                        .collect(),
                },
                maps_to: match r.maps_to {
                    wit::RelatedMapping::AllPrimaries => c::Mapping::AllPrimaries,
                    wit::RelatedMapping::PrimaryNamedByLabel(l) => {
                        c::Mapping::PrimaryNamedByLabel(l)
                    }
                    wit::RelatedMapping::SameName => c::Mapping::SameName,
                },
            })
            .collect(),
        finalizes: m.finalizes,
        validates: m.validates,
    }
}

pub(crate) fn request_in(r: c::ReconcileRequest) -> wit::ReconcileRequest {
    let ctx = r.context;
    wit::ReconcileRequest {
        primary: r.primary,
        owned: r
            .owned
            .into_iter()
            .map(|k| wit::OwnedObjects {
                kind: gvk_in(&k.kind),
                objects: k.objects,
            })
            .collect(),
        related: r
            .related
            .into_iter()
            .map(|k| wit::RelatedObjects {
                kind: gvk_in(&k.kind),
                objects: k.objects,
            })
            .collect(),
        context: wit::Context {
            reconciler: ctx.reconciler,
            trigger: match ctx.trigger {
                c::Trigger::PrimaryChanged => wit::Trigger::PrimaryChanged,
                c::Trigger::ChildChanged(o) => wit::Trigger::ChildChanged(ref_in(&o)),
                c::Trigger::RelatedChanged(o) => wit::Trigger::RelatedChanged(ref_in(&o)),
                c::Trigger::Resync => wit::Trigger::Resync,
                c::Trigger::Requeue => wit::Trigger::Requeue,
                c::Trigger::Retry => wit::Trigger::Retry,
                c::Trigger::ModuleChanged => wit::Trigger::ModuleChanged,
                c::Trigger::DryRun => wit::Trigger::DryRun,
            },
            attempt: ctx.attempt,
            config: ctx.config,
            now_unix_ms: ctx.now_unix_ms,
        },
    }
}

pub(crate) fn validate_in(r: c::ValidateRequest) -> wit::ValidateRequest {
    wit::ValidateRequest {
        operation: match r.operation {
            c::Operation::Create => wit::Operation::Create,
            c::Operation::Update => wit::Operation::Update,
        },
        old: r.old,
        new: r.new,
        config: r.config,
    }
}

/// Bytes of text a verdict carries (checked against the validate output cap).
pub(crate) fn validate_size(r: &wit::ValidateResponse) -> usize {
    match r {
        wit::ValidateResponse::Allowed(warnings) => warnings.iter().map(|w| w.len() + 8).sum(),
        wit::ValidateResponse::Denied(d) => {
            d.message.len() + d.field.as_ref().map_or(0, String::len)
        }
    }
}

/// A verdict as the host hands it on, its text inert: the API server shows denials and
/// warnings to whoever made the request, often in a terminal.
pub(crate) fn validate_out(r: wit::ValidateResponse) -> c::ValidateResponse {
    let inert = |t: String| super::text::inert(&t).into_owned();
    match r {
        wit::ValidateResponse::Allowed(warnings) => c::ValidateResponse::Allowed {
            warnings: warnings.into_iter().map(inert).collect(),
        },
        wit::ValidateResponse::Denied(d) => c::ValidateResponse::Denied {
            message: inert(d.message),
            field: d.field.map(inert),
        },
    }
}

fn parse(json: &str, what: impl FnOnce() -> String) -> Result<Value, CallError> {
    serde_json::from_str(json).map_err(|e| CallError::Malformed {
        detail: super::text::inert(&format!("{} is not JSON: {e}", what())).into_owned(),
    })
}

/// Bytes of text a response carries (checked against the output cap before parsing).
fn effects_size(
    actions: &[wit::Action],
    status: &Option<wit::Status>,
    events: &[wit::Event],
) -> usize {
    let a: usize = actions
        .iter()
        .map(|a| match a {
            wit::Action::MergePatch(p) | wit::Action::JsonPatch(p) => p.body.len() + 64,
            wit::Action::Delete(_) => 64,
        })
        .sum();
    let s = status.as_ref().map_or(0, |s| {
        s.fields.len()
            + s.conditions
                .iter()
                .map(|c| c.type_.len() + c.reason.len() + c.message.len())
                .sum::<usize>()
    });
    let e: usize = events
        .iter()
        .map(|e| e.reason.len() + e.message.len() + e.action.len() + 64)
        .sum();
    a + s + e
}

pub(crate) fn response_size(r: &wit::ReconcileResponse) -> usize {
    let children: usize = r
        .children
        .iter()
        .flat_map(|c| c.objects.iter())
        .map(String::len)
        .sum();
    children + effects_size(&r.actions, &r.status, &r.events)
}

pub(crate) fn finalize_size(r: &wit::FinalizeResponse) -> usize {
    effects_size(&r.actions, &r.status, &r.events)
}

fn actions_out(actions: Vec<wit::Action>) -> Result<Vec<c::Action>, CallError> {
    actions
        .into_iter()
        .enumerate()
        .map(|(i, a)| {
            Ok(match a {
                wit::Action::MergePatch(p) => {
                    let patch = parse(&p.body, || format!("actions[{i}] (merge-patch) body"))?;
                    c::Action::MergePatch {
                        target: ref_out(p.target),
                        patch,
                    }
                }
                wit::Action::JsonPatch(p) => {
                    let patch = parse(&p.body, || format!("actions[{i}] (json-patch) body"))?;
                    c::Action::JsonPatch {
                        target: ref_out(p.target),
                        patch,
                    }
                }
                wit::Action::Delete(d) => c::Action::Delete {
                    target: ref_out(d.target),
                    propagation: match d.propagation {
                        wit::Propagation::Background => c::Propagation::Background,
                        wit::Propagation::Foreground => c::Propagation::Foreground,
                        wit::Propagation::Orphan => c::Propagation::Orphan,
                    },
                },
            })
        })
        .collect()
}

fn status_out(s: Option<wit::Status>) -> Result<Option<c::Status>, CallError> {
    s.map(|s| {
        let fields = parse(&s.fields, || "status.fields".to_string())?;
        Ok(c::Status {
            fields,
            conditions: s
                .conditions
                .into_iter()
                .map(|c| c::Condition {
                    type_: c.type_,
                    status: match c.status {
                        wit::ConditionStatus::True => c::ConditionStatus::True,
                        wit::ConditionStatus::False => c::ConditionStatus::False,
                        wit::ConditionStatus::Unknown => c::ConditionStatus::Unknown,
                    },
                    reason: c.reason,
                    message: c.message,
                })
                .collect(),
        })
    })
    .transpose()
}

fn events_out(events: Vec<wit::Event>) -> Vec<c::Event> {
    events
        .into_iter()
        .map(|e| c::Event {
            type_: match e.type_ {
                wit::EventType::Normal => c::EventType::Normal,
                wit::EventType::Warning => c::EventType::Warning,
            },
            reason: e.reason,
            message: e.message,
            action: e.action,
            regarding: e.regarding.map(ref_out),
        })
        .collect()
}

fn requeue_out(ms: Option<u64>) -> Option<Duration> {
    ms.map(Duration::from_millis)
}

pub(crate) fn response_out(r: wit::ReconcileResponse) -> Result<c::ReconcileResponse, CallError> {
    let children = r
        .children
        .into_iter()
        .map(|set| {
            let kind = gvk_out(set.kind);
            let objects = set
                .objects
                .iter()
                .enumerate()
                .map(|(i, json)| parse(json, || format!("children[{kind}][{i}]")))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(c::ChildSet {
                kind,
                objects,
                keep: Vec::new(),
            })
        })
        .collect::<Result<Vec<_>, CallError>>()?;
    Ok(c::ReconcileResponse {
        children,
        actions: actions_out(r.actions)?,
        status: status_out(r.status)?,
        events: events_out(r.events),
        requeue_after: requeue_out(r.requeue_after_ms),
    })
}

pub(crate) fn finalize_out(r: wit::FinalizeResponse) -> Result<c::FinalizeResponse, CallError> {
    Ok(c::FinalizeResponse {
        done: r.done,
        actions: actions_out(r.actions)?,
        status: status_out(r.status)?,
        events: events_out(r.events),
        requeue_after: requeue_out(r.requeue_after_ms),
    })
}
