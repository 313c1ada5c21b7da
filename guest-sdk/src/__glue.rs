//! Conversions between the SDK's types and the WIT bindings (compiled for Wasm only).

use crate::__bindings::wasmop::reconciler::types as wit;
use crate::{
    Action, ConditionStatus, Context, EventType, Finalized, Gvk, Mapping, Metadata, ObjectRef,
    Operation, Propagation, Reconciler, Request, Response, SelectorOperator, Trigger,
    ValidateRequest, Validation,
};

fn gvk_to(g: Gvk) -> wit::Gvk {
    wit::Gvk {
        api_version: g.api_version,
        kind: g.kind,
    }
}

fn gvk_from(g: wit::Gvk) -> Gvk {
    Gvk::new(g.api_version, g.kind)
}

fn ref_to(r: ObjectRef) -> wit::ObjectRef {
    wit::ObjectRef {
        api_version: r.api_version,
        kind: r.kind,
        namespace: r.namespace,
        name: r.name,
    }
}

fn ref_from(r: wit::ObjectRef) -> ObjectRef {
    ObjectRef {
        api_version: r.api_version,
        kind: r.kind,
        namespace: r.namespace,
        name: r.name,
    }
}

pub fn metadata<R: Reconciler>() -> wit::ModuleMetadata {
    let m: Metadata = R::metadata();
    wit::ModuleMetadata {
        name: m.name,
        version: m.version,
        primary: gvk_to(m.primary),
        owns: m.owns.into_iter().map(gvk_to).collect(),
        related: m
            .related
            .into_iter()
            .map(|r| wit::RelatedKind {
                kind: gvk_to(r.kind),
                selector: wit::LabelSelector {
                    match_labels: r.selector.match_labels,
                    match_expressions: r
                        .selector
                        .match_expressions
                        .into_iter()
                        .map(|e| wit::SelectorRequirement {
                            key: e.key,
                            operator: match e.operator {
                                SelectorOperator::In => wit::SelectorOperator::In,
                                SelectorOperator::NotIn => wit::SelectorOperator::NotIn,
                                SelectorOperator::Exists => wit::SelectorOperator::Exists,
                                SelectorOperator::DoesNotExist => {
                                    wit::SelectorOperator::DoesNotExist
                                }
                            },
                            values: e.values,
                        })
                        .collect(),
                },
                maps_to: match r.maps_to {
                    Mapping::AllPrimaries => wit::RelatedMapping::AllPrimaries,
                    Mapping::PrimaryNamedByLabel(l) => wit::RelatedMapping::PrimaryNamedByLabel(l),
                    Mapping::SameName => wit::RelatedMapping::SameName,
                },
            })
            .collect(),
        finalizes: m.finalizes,
        validates: m.validates,
    }
}

fn request_from(r: wit::ReconcileRequest) -> Request {
    let c = r.context;
    let trigger = match c.trigger {
        wit::Trigger::PrimaryChanged => Trigger::PrimaryChanged,
        wit::Trigger::ChildChanged(o) => Trigger::ChildChanged(ref_from(o)),
        wit::Trigger::RelatedChanged(o) => Trigger::RelatedChanged(ref_from(o)),
        wit::Trigger::Resync => Trigger::Resync,
        wit::Trigger::Requeue => Trigger::Requeue,
        wit::Trigger::Retry => Trigger::Retry,
        wit::Trigger::ModuleChanged => Trigger::ModuleChanged,
        wit::Trigger::DryRun => Trigger::DryRun,
    };
    Request {
        primary: r.primary,
        owned: r
            .owned
            .into_iter()
            .map(|g| (gvk_from(g.kind), g.objects))
            .collect(),
        related: r
            .related
            .into_iter()
            .map(|g| (gvk_from(g.kind), g.objects))
            .collect(),
        context: Context {
            reconciler: c.reconciler,
            trigger,
            attempt: c.attempt,
            config: c.config,
            now_unix_ms: c.now_unix_ms,
        },
    }
}

fn error_to(e: crate::Error) -> wit::ReconcileError {
    wit::ReconcileError {
        message: e.message().to_string(),
    }
}

struct Effects {
    actions: Vec<wit::Action>,
    status: Option<wit::Status>,
    events: Vec<wit::Event>,
    requeue_after_ms: Option<u64>,
}

fn effects_to(r: &mut Response) -> Result<Effects, wit::ReconcileError> {
    if let Some(e) = r.error.take() {
        return Err(error_to(e));
    }
    let actions = std::mem::take(&mut r.actions)
        .into_iter()
        .map(|a| match a {
            Action::MergePatch { target, patch } => wit::Action::MergePatch(wit::Patch {
                target: ref_to(target),
                body: patch.to_string(),
            }),
            Action::JsonPatch { target, patch } => wit::Action::JsonPatch(wit::Patch {
                target: ref_to(target),
                body: patch.to_string(),
            }),
            Action::Delete {
                target,
                propagation,
            } => wit::Action::Delete(wit::DeleteIntent {
                target: ref_to(target),
                propagation: match propagation {
                    Propagation::Background => wit::Propagation::Background,
                    Propagation::Foreground => wit::Propagation::Foreground,
                    Propagation::Orphan => wit::Propagation::Orphan,
                },
            }),
        })
        .collect();
    let status = r.status.take().map(|s| wit::Status {
        fields: s.fields.to_string(),
        conditions: s
            .conditions
            .into_iter()
            .map(|c| wit::Condition {
                type_: c.type_,
                status: match c.status {
                    ConditionStatus::True => wit::ConditionStatus::True,
                    ConditionStatus::False => wit::ConditionStatus::False,
                    ConditionStatus::Unknown => wit::ConditionStatus::Unknown,
                },
                reason: c.reason,
                message: c.message,
            })
            .collect(),
    });
    let events = std::mem::take(&mut r.events)
        .into_iter()
        .map(|e| wit::Event {
            type_: match e.type_ {
                EventType::Normal => wit::EventType::Normal,
                EventType::Warning => wit::EventType::Warning,
            },
            reason: e.reason,
            message: e.message,
            action: e.action,
            regarding: e.regarding.map(ref_to),
        })
        .collect();
    let requeue_after_ms = r
        .requeue_after
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    Ok(Effects {
        actions,
        status,
        events,
        requeue_after_ms,
    })
}

pub fn reconcile<R: Reconciler>(
    request: wit::ReconcileRequest,
) -> Result<wit::ReconcileResponse, wit::ReconcileError> {
    let request = request_from(request);
    let mut response = R::reconcile(&request).map_err(error_to)?;
    let effects = effects_to(&mut response)?;
    Ok(wit::ReconcileResponse {
        children: std::mem::take(&mut response.children)
            .into_iter()
            .map(|(kind, objects)| wit::ChildSet {
                kind: gvk_to(kind),
                objects,
            })
            .collect(),
        actions: effects.actions,
        status: effects.status,
        events: effects.events,
        requeue_after_ms: effects.requeue_after_ms,
    })
}

pub fn finalize<R: Reconciler>(
    request: wit::ReconcileRequest,
) -> Result<wit::FinalizeResponse, wit::ReconcileError> {
    let request = request_from(request);
    let Finalized { done, mut effects } = R::finalize(&request).map_err(error_to)?;
    if effects
        .children
        .iter()
        .any(|(_, objects)| !objects.is_empty())
    {
        return Err(wit::ReconcileError {
            message: "finalize returned children; only actions, status, Events and a requeue delay are allowed while deleting".into(),
        });
    }
    let e = effects_to(&mut effects)?;
    Ok(wit::FinalizeResponse {
        done,
        actions: e.actions,
        status: e.status,
        events: e.events,
        requeue_after_ms: e.requeue_after_ms,
    })
}

pub fn validate<R: Reconciler>(request: wit::ValidateRequest) -> wit::ValidateResponse {
    let request = ValidateRequest {
        operation: match request.operation {
            wit::Operation::Create => Operation::Create,
            wit::Operation::Update => Operation::Update,
        },
        old: request.old,
        new: request.new,
        config: request.config,
    };
    match R::validate(&request) {
        Validation::Allowed(warnings) => wit::ValidateResponse::Allowed(warnings),
        Validation::Denied { message, field } => {
            wit::ValidateResponse::Denied(wit::Denial { message, field })
        }
    }
}
