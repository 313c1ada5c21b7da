//! A hook's answer, as wasmop's intents: the desired children through each child kind's update
//! strategy, the status, `resyncAfterSeconds` and `finalized`.
//!
//! # Guarantees
//! - Every child kind of the controller gets a complete set: an observed child the hook did
//!   not return is deleted (Metacontroller's rule), with the uid precondition of every prune.
//! - A child the hook returns that exists already is written only as its kind's method says:
//!   `OnDelete` never; `InPlace` always (a no-op write is skipped by the host); `Recreate`
//!   deletes it when it differs (a later sync creates it again); the rolling methods do the
//!   same for one differing child at a time, and only while every child of the kind passes the
//!   status checks. The others are kept exactly as they are.
//! - A child of a kind the controller does not list, a response that is not a JSON object, or
//!   (strict) one with unknown fields is refused whole: nothing of it is written.
//!
//! # Caveats
//! - While finalizing, wasmop deletes the children the hook no longer returns but creates and
//!   updates none (a finalize answer carries no children in wasmop's contract).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::{Map, Value};

use crate::contract::{
    Action, ChildKey, ChildSet, Condition, ConditionStatus, Event, EventType, FinalizeResponse,
    Gvk, ObjectRef, Propagation, ReconcileResponse, Status,
};
use crate::controller::noop::covers_object;
use crate::crd::{ConditionCheck, HookChild, HookSpec, UpdateMethod};

use super::document::{DECORATOR_ANNOTATION, Observed};

/// The annotation on every child a hook's answer writes: the digest of what the hook asked
/// for. `Recreate` and the rolling methods compare it, not the object, with the next answer: the
/// API server adds defaults and other admissions' fields (a Pod's service-account token
/// volume), so an object never equals what was asked for.
pub const DESIRED_ANNOTATION: &str = crate::redact::DESIRED_DIGEST;

/// The fields a sync or finalize answer may have.
const FIELDS: [&str; 5] = [
    "status",
    "children",
    "resyncAfterSeconds",
    "finalized",
    "events",
];

/// The fields a DecoratorController's sync or finalize answer may have.
const DECORATOR_FIELDS: [&str; 7] = [
    "labels",
    "annotations",
    "status",
    "attachments",
    "resyncAfterSeconds",
    "finalized",
    "events",
];

/// A parsed answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// The status to write (None: left as it is).
    pub status: Option<Status>,
    /// The desired children per kind of the controller.
    pub children: Vec<(Gvk, Vec<Value>)>,
    /// `resyncAfterSeconds`.
    pub resync_after: Option<Duration>,
    /// `finalized`.
    pub finalized: bool,
    /// `events`, wasmop's addition: Events about the parent (Metacontroller has none).
    pub events: Vec<Event>,
    /// A decorator's `labels` for the parent (a null value removes the label).
    pub labels: Map<String, Value>,
    /// A decorator's `annotations` for the parent (a null value removes the annotation).
    pub annotations: Map<String, Value>,
}

/// Parses `body` for `spec`.
///
/// # Errors
/// Why the answer is refused (the hook's fault), inert (it quotes the hook's keys and kinds,
/// and reaches logs and Events).
pub fn parse(spec: &HookSpec, body: &str) -> Result<Answer, String> {
    parse_answer(spec, body).map_err(|e| crate::text::inert(&e).into_owned())
}

fn parse_answer(spec: &HookSpec, body: &str) -> Result<Answer, String> {
    let value: Value =
        serde_json::from_str(body).map_err(|e| format!("the hook's answer is not JSON: {e}"))?;
    let Value::Object(mut map) = value else {
        return Err("the hook's answer is not a JSON object".into());
    };
    let (children_field, fields) = match spec.decorator {
        None => ("children", &FIELDS[..]),
        Some(_) => ("attachments", &DECORATOR_FIELDS[..]),
    };
    if spec.strict
        && let Some(unknown) = map.keys().find(|k| !fields.contains(&k.as_str()))
    {
        return Err(format!(
            "the hook's answer has the unknown field {unknown:?} (strict: the hook's responseUnMarshallMode or version v2)"
        ));
    }
    let children = children(
        spec,
        children_field,
        map.remove(children_field).unwrap_or(Value::Null),
    )?;
    let (labels, annotations) = match spec.decorator {
        None => Default::default(),
        Some(_) => (
            string_map("labels", map.remove("labels"))?,
            string_map("annotations", map.remove("annotations"))?,
        ),
    };
    let resync_after = match map.remove("resyncAfterSeconds") {
        None | Some(Value::Null) => None,
        Some(v) => seconds(&v)?,
    };
    let status = status(map.remove("status").unwrap_or(Value::Null))?;
    Ok(Answer {
        // A composite controller's answer replaces the whole status (none: `{}`), as
        // Metacontroller does; a decorator's missing status leaves the object's alone.
        status: match spec.decorator {
            None => Some(status.unwrap_or_else(|| Status {
                fields: Value::Object(Map::new()),
                conditions: Vec::new(),
            })),
            Some(_) => status,
        },
        children,
        resync_after,
        finalized: map
            .remove("finalized")
            .and_then(|v| v.as_bool())
            .unwrap_or(false),
        events: events(map.remove("events").unwrap_or(Value::Null))?,
        labels,
        annotations,
    })
}

/// A decorator's `labels` or `annotations`: strings, or null to remove one.
fn string_map(field: &str, value: Option<Value>) -> Result<Map<String, Value>, String> {
    let map = match value {
        None | Some(Value::Null) => return Ok(Map::new()),
        Some(Value::Object(map)) => map,
        Some(_) => return Err(format!("the hook's {field} is not a JSON object")),
    };
    match map.iter().find(|(_, v)| !(v.is_string() || v.is_null())) {
        Some((k, _)) => Err(format!(
            "the hook's {field}.{k} is neither a string nor null"
        )),
        None => Ok(map),
    }
}

/// `events`: `[{type: Normal|Warning, reason, message}]`, Events about the parent, checked and
/// counted as a module's are.
fn events(value: Value) -> Result<Vec<Event>, String> {
    let list = match value {
        Value::Null => return Ok(Vec::new()),
        Value::Array(list) => list,
        _ => return Err("the hook's events is not a list".into()),
    };
    list.iter()
        .enumerate()
        .map(|(i, e)| {
            let text = |f: &str| {
                e.get(f)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string()
            };
            let type_ = match text("type").as_str() {
                "" | "Normal" => EventType::Normal,
                "Warning" => EventType::Warning,
                other => return Err(format!("events[{i}] has type {other:?}: Normal or Warning")),
            };
            Ok(Event {
                type_,
                reason: text("reason"),
                message: text("message"),
                action: text("action"),
                regarding: None,
            })
        })
        .collect()
}

/// The largest `resyncAfterSeconds` taken as given; more is held at it (the requeue is
/// clamped further by the host).
const MAX_RESYNC_SECONDS: f64 = 1e9;

/// `resyncAfterSeconds`: a resync only when above 0, as Metacontroller (a Go hook sends 0 when
/// it means none); a number too large is held at [`MAX_RESYNC_SECONDS`].
fn seconds(v: &Value) -> Result<Option<Duration>, String> {
    let s = v
        .as_f64()
        .filter(|s| s.is_finite())
        .ok_or_else(|| "resyncAfterSeconds is not a number of seconds".to_string())?;
    Ok((s > 0.0).then(|| Duration::from_secs_f64(s.min(MAX_RESYNC_SECONDS))))
}

fn children(spec: &HookSpec, field: &str, value: Value) -> Result<Vec<(Gvk, Vec<Value>)>, String> {
    let list = match value {
        Value::Null => Vec::new(),
        Value::Array(list) => list,
        _ => return Err(format!("the hook's {field} is not a list")),
    };
    let mut sets: Vec<(Gvk, Vec<Value>)> = spec
        .children
        .iter()
        .map(|c| (c.gvk(), Vec::new()))
        .collect();
    for (i, child) in list.into_iter().enumerate() {
        let text = |f: &str| {
            child
                .get(f)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let kind = Gvk::new(text("apiVersion"), text("kind"));
        let Some((_, set)) = sets.iter_mut().find(|(k, _)| *k == kind) else {
            return Err(format!(
                "{field}[{i}] is a {kind}, which is not {} resource of the controller",
                if field == "children" {
                    "a child"
                } else {
                    "an attachment"
                }
            ));
        };
        set.push(child);
    }
    Ok(sets)
}

/// The hook's status as wasmop's: its conditions typed, `observedGeneration` left to the host.
fn status(value: Value) -> Result<Option<Status>, String> {
    let mut fields = match value {
        Value::Null => return Ok(None),
        Value::Object(map) => map,
        _ => return Err("the hook's status is not a JSON object".into()),
    };
    fields.remove("observedGeneration");
    let conditions = match fields.remove("conditions") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(list)) => list.iter().map(condition).collect::<Result<_, _>>()?,
        Some(_) => return Err("the hook's status.conditions is not a list".into()),
    };
    Ok(Some(Status {
        fields: Value::Object(fields),
        conditions,
    }))
}

fn condition(c: &Value) -> Result<Condition, String> {
    let text = |f: &str| {
        c.get(f)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let status = match text("status").as_str() {
        "True" => ConditionStatus::True,
        "False" => ConditionStatus::False,
        "Unknown" | "" => ConditionStatus::Unknown,
        other => {
            return Err(format!(
                "status condition {:?} has status {other:?}: True, False or Unknown",
                text("type")
            ));
        }
    };
    let reason = text("reason");
    Ok(Condition {
        type_: text("type"),
        status,
        // Kubernetes requires a reason; a hook's condition without one gets this.
        reason: if reason.is_empty() {
            "Unspecified".into()
        } else {
            reason
        },
        message: text("message"),
    })
}

/// The namespace and name of `object`; a namespaced parent's children default to its namespace
/// (an empty `metadata.namespace` is unset, as Metacontroller takes it).
fn key_of(object: &Value, parent_namespace: Option<&str>) -> ChildKey {
    let text = |p: &str| {
        object
            .pointer(p)
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
            .map(str::to_string)
    };
    ChildKey {
        namespace: text("/metadata/namespace").or_else(|| parent_namespace.map(str::to_string)),
        name: text("/metadata/name").unwrap_or_default(),
    }
}

/// Whether `child` has every condition `checks` asks for.
fn passes(child: &Value, checks: &[ConditionCheck]) -> bool {
    let conditions = child
        .pointer("/status/conditions")
        .and_then(Value::as_array);
    checks.iter().all(|check| {
        conditions.into_iter().flatten().any(|c| {
            let is = |f: &str, want: &Option<String>| {
                want.as_deref()
                    .is_none_or(|w| c.get(f).and_then(Value::as_str) == Some(w))
            };
            c.get("type").and_then(Value::as_str) == Some(check.type_.as_str())
                && is("status", &check.status)
                && is("reason", &check.reason)
        })
    })
}

/// The sha256 of `desired` as JSON text, in hex. serde_json's maps are sorted by key (its
/// `preserve_order` feature is off; a unit test fails if it comes on), so equal objects give
/// equal text whatever order the hook wrote their keys in.
fn desired_digest(desired: &Value) -> String {
    crate::engine::sha256_hex(desired.to_string().as_bytes())
}

/// The digest [`DESIRED_ANNOTATION`] of `object` holds, if any.
fn annotation(object: &Value) -> Option<&str> {
    object
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(DESIRED_ANNOTATION))
        .and_then(Value::as_str)
}

/// `desired` with [`DESIRED_ANNOTATION`] set to `digest`.
fn stamped(desired: Value, digest: String) -> Value {
    annotated(desired, DESIRED_ANNOTATION, digest)
}

/// `desired` with the annotation `key` set to `value`.
fn annotated(mut desired: Value, key: &str, value: String) -> Value {
    if let Some(meta) = desired.get_mut("metadata").and_then(Value::as_object_mut) {
        let annotations = meta
            .entry("annotations")
            .or_insert_with(|| Value::Object(Default::default()));
        if !annotations.is_object() {
            *annotations = Value::Object(Default::default());
        }
        if let Some(map) = annotations.as_object_mut() {
            map.insert(key.into(), Value::String(value));
        }
    }
    desired
}

/// What happens to the desired children of one kind: written, or kept as they are. Observed
/// children in neither are deleted (pruned).
fn plan(
    child: &HookChild,
    desired: Vec<Value>,
    observed: &[Value],
    parent_ns: Option<&str>,
) -> ChildSet {
    let observed: BTreeMap<ChildKey, &Value> =
        observed.iter().map(|o| (key_of(o, None), o)).collect();
    let rolling = matches!(
        child.method,
        UpdateMethod::RollingRecreate | UpdateMethod::RollingInPlace
    );
    let all_pass = observed.values().all(|o| passes(o, &child.status_checks));
    let mut next_rolls = rolling && all_pass;
    let (mut objects, mut keep) = (Vec::new(), Vec::new());
    for d in desired {
        let key = key_of(&d, parent_ns);
        let Some(current) = observed.get(&key) else {
            let digest = desired_digest(&d);
            objects.push(stamped(d, digest));
            continue;
        };
        let digest = desired_digest(&d);
        let differs = match annotation(current) {
            Some(seen) => seen != digest,
            // Not written by wasmop (Metacontroller made it): compared field by field.
            None => !covers_object(&d, current),
        };
        let d = stamped(d, digest);
        let update = match child.method {
            UpdateMethod::OnDelete => false,
            UpdateMethod::InPlace => true,
            UpdateMethod::Recreate => differs,
            UpdateMethod::RollingRecreate | UpdateMethod::RollingInPlace => {
                differs && std::mem::take(&mut next_rolls)
            }
        };
        match (update, child.method) {
            (true, UpdateMethod::InPlace | UpdateMethod::RollingInPlace) => objects.push(d),
            // Recreate: neither written nor kept, so pruned; the next sync creates it.
            (true, _) => {}
            (false, _) => keep.push(key),
        }
    }
    ChildSet {
        kind: child.gvk(),
        objects,
        keep,
    }
}

/// A sync answer as a reconcile response.
pub fn reconcile_response(
    spec: &HookSpec,
    observed: &Observed,
    answer: Answer,
) -> ReconcileResponse {
    let parent_ns = observed.parent_namespace();
    let decorator = spec.decorator.as_ref().map(|d| d.name.as_str());
    let foreign = |i: usize| {
        observed
            .foreign
            .get(i)
            .map_or(&[][..], |(_, f)| f.as_slice())
    };
    let children = spec
        .children
        .iter()
        .zip(answer.children)
        .zip(&observed.children)
        .enumerate()
        .map(|(i, ((child, (_, desired)), (_, seen)))| {
            // Another decorator's attachment (or the decorated object's own child) of a name
            // the hook answers is left as it is, as Metacontroller's failed create leaves it.
            let theirs: BTreeSet<ChildKey> = foreign(i).iter().map(|o| key_of(o, None)).collect();
            let desired = desired
                .into_iter()
                .filter(|d| !theirs.contains(&key_of(d, parent_ns)))
                .map(|d| match decorator {
                    Some(name) => annotated(d, DECORATOR_ANNOTATION, name.to_string()),
                    None => d,
                })
                .collect();
            let mut set = plan(child, desired, seen, parent_ns);
            set.keep.extend(foreign(i).iter().map(|o| key_of(o, None)));
            set
        })
        .collect();
    ReconcileResponse {
        children,
        actions: parent_metadata(&observed.parent, &answer.labels, &answer.annotations)
            .into_iter()
            .collect(),
        status: answer.status,
        events: answer.events,
        requeue_after: answer.resync_after,
    }
}

/// The merge patch of a decorator's `labels` and `annotations` on `parent`: only the keys whose
/// value would change (None: nothing would, so nothing is written).
fn parent_metadata(
    parent: &Value,
    labels: &Map<String, Value>,
    annotations: &Map<String, Value>,
) -> Option<Action> {
    let changes = |field: &str, wanted: &Map<String, Value>| -> Map<String, Value> {
        let current = parent.pointer(&format!("/metadata/{field}"));
        wanted
            .iter()
            .filter(|(k, v)| {
                current
                    .and_then(|c| c.get(k.as_str()))
                    .unwrap_or(&Value::Null)
                    != *v
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    let mut metadata = Map::new();
    for (field, wanted) in [("labels", labels), ("annotations", annotations)] {
        let changed = changes(field, wanted);
        if !changed.is_empty() {
            metadata.insert(field.into(), Value::Object(changed));
        }
    }
    if metadata.is_empty() {
        return None;
    }
    let text = |p: &str| {
        parent
            .pointer(p)
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    Some(Action::MergePatch {
        target: ObjectRef {
            api_version: text("/apiVersion").unwrap_or_default(),
            kind: text("/kind").unwrap_or_default(),
            namespace: text("/metadata/namespace"),
            name: text("/metadata/name").unwrap_or_default(),
        },
        patch: serde_json::json!({ "metadata": metadata }),
    })
}

/// A finalize answer as a finalize response: the observed children the hook no longer returns
/// are deleted.
pub fn finalize_response(observed: &Observed, answer: Answer) -> FinalizeResponse {
    let parent_ns = observed.parent_namespace();
    let mut actions = Vec::new();
    for ((kind, seen), (_, desired)) in observed.children.iter().zip(&answer.children) {
        let wanted: BTreeSet<ChildKey> = desired.iter().map(|d| key_of(d, parent_ns)).collect();
        for o in seen.iter().filter(|o| !wanted.contains(&key_of(o, None))) {
            let key = key_of(o, None);
            actions.push(Action::Delete {
                target: ObjectRef {
                    api_version: kind.api_version.clone(),
                    kind: kind.kind.clone(),
                    namespace: key.namespace,
                    name: key.name,
                },
                propagation: Propagation::Background,
            });
        }
    }
    actions.extend(parent_metadata(
        &observed.parent,
        &answer.labels,
        &answer.annotations,
    ));
    FinalizeResponse {
        done: answer.finalized,
        actions,
        status: answer.status,
        events: answer.events,
        requeue_after: answer.resync_after,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(method: &str) -> HookSpec {
        serde_json::from_value(json!({
            "controller": {},
            "children": [{"apiVersion": "v1", "kind": "Pod", "method": method,
                "statusChecks": [{"type": "Ready", "status": "True"}]}],
            "sync": "/sync"
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    fn pod(name: &str, image: &str, ready: bool) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ns"},
            "spec": {"containers": [{"name": "c", "image": image}]},
            "status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}})
    }

    fn desired(name: &str, image: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": image}]}})
    }

    /// Metacontroller resyncs only when `resyncAfterSeconds` is above 0 (a Go hook sends 0 by
    /// default): 0 or a negative value asks for no resync (it requeued every 100 ms, for
    /// ever); a huge one is held at the largest; only what is not a number is refused.
    #[test]
    fn resync_after_zero_or_negative_asks_for_none_and_huge_is_held() {
        let spec = spec("InPlace");
        let resync = |v: Value| {
            parse(&spec, &json!({"resyncAfterSeconds": v}).to_string()).map(|a| a.resync_after)
        };
        assert_eq!(resync(json!(0)), Ok(None));
        assert_eq!(resync(json!(0.0)), Ok(None));
        assert_eq!(resync(json!(-1)), Ok(None));
        assert_eq!(resync(json!(2.5)), Ok(Some(Duration::from_millis(2500))));
        assert!(matches!(resync(json!(1e300)), Ok(Some(d)) if d >= Duration::from_secs(86_400)));
        assert!(resync(json!("5")).is_err());
    }

    /// A refusal quotes the hook's keys and kinds: made inert, it cannot forge a log line or
    /// hide text behind a bidi mark.
    #[test]
    fn a_refusal_quotes_the_hooks_text_inert() {
        let bodies = [
            json!({"labels": {"a\nINFO forged": 1}}),
            json!({"attachments": [{"apiVersion": "v1\u{202e}x", "kind": "Pod\nINFO forged"}]}),
        ];
        for body in bodies {
            let Err(e) = parse(&decorator_spec(false), &body.to_string()) else {
                panic!("{body} is refused")
            };
            assert!(!e.contains('\n') && !e.contains('\u{202e}'), "{e:?}");
        }
    }

    /// The written names and the kept names of the one set of `method`'s plan.
    fn run(method: &str, want: Vec<Value>, seen: Vec<Value>) -> (Vec<String>, Vec<String>) {
        let spec = spec(method);
        let observed = Observed {
            parent: json!({"metadata": {"name": "p", "namespace": "ns"}}),
            related: Vec::new(),
            children: vec![(Gvk::new("v1", "Pod"), seen)],
            foreign: Vec::new(),
        };
        let body = json!({"children": want}).to_string();
        let answer = parse(&spec, &body).unwrap_or_else(|e| panic!("{e}"));
        let response = reconcile_response(&spec, &observed, answer);
        let set = &response.children[0];
        let names = set
            .objects
            .iter()
            .map(|o| {
                o["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect();
        (names, set.keep.iter().map(|k| k.name.clone()).collect())
    }

    #[test]
    fn on_delete_creates_what_is_missing_and_never_touches_what_exists() {
        let (written, kept) = run(
            "OnDelete",
            vec![desired("a", "v2"), desired("b", "v2")],
            vec![pod("a", "v1", true), pod("gone", "v1", true)],
        );
        assert_eq!(written, ["b"]);
        // `gone` is neither written nor kept: pruned.
        assert_eq!(kept, ["a"]);
    }

    #[test]
    fn in_place_writes_every_desired_child() {
        let (written, kept) = run(
            "InPlace",
            vec![desired("a", "v2"), desired("b", "v1")],
            vec![pod("a", "v1", true), pod("b", "v1", true)],
        );
        assert_eq!(written, ["a", "b"]);
        assert!(kept.is_empty());
    }

    #[test]
    fn recreate_deletes_each_child_that_differs_and_keeps_the_others() {
        let (written, kept) = run(
            "Recreate",
            vec![desired("a", "v2"), desired("b", "v1")],
            vec![pod("a", "v1", true), pod("b", "v1", true)],
        );
        assert!(written.is_empty());
        assert_eq!(kept, ["b"]);
    }

    #[test]
    fn rolling_updates_one_differing_child_at_a_time_in_the_hooks_order() {
        let want = vec![desired("b", "v2"), desired("a", "v2")];
        let (written, kept) = run(
            "RollingInPlace",
            want.clone(),
            vec![pod("a", "v1", true), pod("b", "v1", true)],
        );
        assert_eq!(written, ["b"]);
        assert_eq!(kept, ["a"]);
        let (written, kept) = run(
            "RollingRecreate",
            want,
            vec![pod("a", "v1", true), pod("b", "v1", true)],
        );
        assert!(written.is_empty());
        assert_eq!(kept, ["a"]);
    }

    #[test]
    fn rolling_waits_while_a_child_fails_its_status_checks() {
        let want = vec![desired("b", "v2"), desired("a", "v2"), desired("c", "v1")];
        let (written, kept) = run(
            "RollingRecreate",
            want,
            vec![pod("a", "v1", true), pod("b", "v1", false)],
        );
        // `c` is new: created whatever the checks say.
        assert_eq!(written, ["c"]);
        assert_eq!(kept, ["b", "a"]);
    }

    #[test]
    fn what_the_server_adds_to_a_child_is_no_difference_once_wasmop_wrote_it() {
        // First answer: `a` is created, stamped with the digest of what the hook asked for.
        let (written, _) = run("Recreate", vec![desired("a", "v1")], vec![]);
        assert_eq!(written, ["a"]);
        let spec = spec("Recreate");
        let body = json!({"children": [desired("a", "v1")]}).to_string();
        let observed = Observed {
            parent: json!({"metadata": {"name": "p", "namespace": "ns"}}),
            related: Vec::new(),
            children: vec![(Gvk::new("v1", "Pod"), vec![])],
            foreign: Vec::new(),
        };
        let first = reconcile_response(
            &spec,
            &observed,
            parse(&spec, &body).unwrap_or_else(|e| panic!("{e}")),
        );
        let mut stored = first.children[0].objects[0].clone();
        assert!(annotation(&stored).is_some(), "stamped: {stored}");
        stored["metadata"]["namespace"] = json!("ns");
        // The API server adds a token volume: the object no longer covers the answer...
        stored["spec"]["containers"][0]["volumeMounts"] =
            json!([{"name": "kube-api-access", "mountPath": "/var/run"}]);
        if let Some(c) = stored["spec"]["containers"].as_array_mut() {
            c.push(json!({"name": "sidecar"}));
        }
        // ...but the same answer is no difference, and a changed one is.
        let (written, kept) = run("Recreate", vec![desired("a", "v1")], vec![stored.clone()]);
        assert!(written.is_empty());
        assert_eq!(kept, ["a"]);
        let (written, kept) = run("Recreate", vec![desired("a", "v2")], vec![stored]);
        assert!(
            written.is_empty() && kept.is_empty(),
            "recreated: neither written nor kept"
        );
    }

    #[test]
    fn events_in_an_answer_become_events_about_the_parent() {
        let body = json!({"events": [{"type": "Warning", "reason": "ScaledDown", "message": "3 to 2"}, {"reason": "Synced"}]}).to_string();
        let mut s = spec("InPlace");
        s.strict = true;
        let answer = parse(&s, &body).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(answer.events.len(), 2);
        assert_eq!(answer.events[0].type_, EventType::Warning);
        assert_eq!(answer.events[0].reason, "ScaledDown");
        assert_eq!(answer.events[1].type_, EventType::Normal);
        let bad = json!({"events": [{"type": "Loud", "reason": "X"}]}).to_string();
        assert!(parse(&s, &bad).is_err());
    }

    #[test]
    fn the_digest_of_what_a_hook_asked_for_ignores_the_order_of_its_keys() {
        let a: Value = serde_json::from_str(r#"{"b": 1, "a": {"y": [1, 2], "x": "s"}}"#)
            .unwrap_or_else(|e| panic!("{e}"));
        let b: Value = serde_json::from_str(r#"{"a": {"x": "s", "y": [1, 2]}, "b": 1}"#)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(desired_digest(&a), desired_digest(&b));
        assert_ne!(desired_digest(&a), desired_digest(&json!({"b": 2})));
    }

    fn decorator_spec(strict: bool) -> HookSpec {
        serde_json::from_value(json!({
            "controller": {},
            "children": [{"apiVersion": "v1", "kind": "Service"}],
            "sync": "/sync", "strict": strict,
            "decorator": {"name": "spp"}
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    fn service(name: &str, decorator: Option<&str>) -> Value {
        let annotations = match decorator {
            Some(d) => json!({DECORATOR_ANNOTATION: d}),
            None => json!({}),
        };
        json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": "ns", "annotations": annotations}})
    }

    fn statefulset() -> Observed {
        Observed {
            parent: json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
                "metadata": {"name": "web", "namespace": "ns",
                    "labels": {"app": "web"}, "annotations": {"note": "a"}}}),
            children: vec![(
                Gvk::new("v1", "Service"),
                vec![service("web-0", Some("spp"))],
            )],
            related: Vec::new(),
            foreign: vec![(
                Gvk::new("v1", "Service"),
                vec![service("theirs", Some("other"))],
            )],
        }
    }

    #[test]
    fn a_decorator_stamps_its_attachments_keeps_the_others_and_patches_only_changed_metadata() {
        let spec = decorator_spec(true);
        let body = json!({
            "attachments": [
                {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web-0"}},
                {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web-1"}}],
            "labels": {"app": "web", "tier": "db", "gone": null},
            "annotations": {"note": null}
        });
        let answer = parse(&spec, &body.to_string()).unwrap_or_else(|e| panic!("{e}"));
        let response = reconcile_response(&spec, &statefulset(), answer);
        let set = &response.children[0];
        assert_eq!(set.objects.len(), 1, "web-0 exists (OnDelete): only web-1");
        assert_eq!(set.objects[0]["metadata"]["name"], "web-1");
        assert_eq!(
            set.objects[0]["metadata"]["annotations"][DECORATOR_ANNOTATION],
            "spp"
        );
        let kept: Vec<&str> = set.keep.iter().map(|k| k.name.as_str()).collect();
        assert_eq!(
            kept,
            ["web-0", "theirs"],
            "another decorator's Service is kept"
        );
        let [Action::MergePatch { target, patch }] = response.actions.as_slice() else {
            panic!("one patch of the parent: {:?}", response.actions);
        };
        assert_eq!(
            (target.kind.as_str(), target.name.as_str()),
            ("StatefulSet", "web")
        );
        // Only what changes: `app` is already there, `gone` is already absent.
        assert_eq!(
            *patch,
            json!({"metadata": {"labels": {"tier": "db"}, "annotations": {"note": null}}})
        );
    }

    /// Two decorators answering one name: the other's attachment is not taken over (written
    /// with force and stamped as this one's, then back, for ever); Metacontroller's create
    /// fails on the name and leaves it as it is.
    #[test]
    fn a_decorator_does_not_take_over_another_decorators_attachment() {
        let spec = decorator_spec(false);
        let body = json!({"attachments": [
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "theirs"}}]});
        let answer = parse(&spec, &body.to_string()).unwrap_or_else(|e| panic!("{e}"));
        let response = reconcile_response(&spec, &statefulset(), answer);
        let set = &response.children[0];
        let written: Vec<&Value> = set.objects.iter().map(|o| &o["metadata"]["name"]).collect();
        assert!(written.is_empty(), "{written:?}");
        assert!(set.keep.iter().any(|k| k.name == "theirs"));
    }

    #[test]
    fn a_decorator_answer_that_changes_nothing_writes_nothing_on_the_parent() {
        let spec = decorator_spec(false);
        let body = json!({"labels": {"app": "web"}, "annotations": {"note": "a", "absent": null}});
        let answer = parse(&spec, &body.to_string()).unwrap_or_else(|e| panic!("{e}"));
        let response = reconcile_response(&spec, &statefulset(), answer);
        assert!(response.actions.is_empty(), "{:?}", response.actions);
        let finalize = finalize_response(
            &statefulset(),
            parse(&spec, "{}").unwrap_or_else(|e| panic!("{e}")),
        );
        let deleted: Vec<String> = finalize
            .actions
            .iter()
            .map(|a| a.target().name.clone())
            .collect();
        assert_eq!(
            deleted,
            ["web-0"],
            "its own attachment only, never another's"
        );
    }

    #[test]
    fn a_decorator_answer_is_read_with_its_own_fields() {
        let strict = decorator_spec(true);
        let err = parse(&strict, r#"{"children": []}"#)
            .err()
            .unwrap_or_default();
        assert!(err.contains("unknown field \"children\""), "{err}");
        let err = parse(&strict, r#"{"labels": {"a": 1}}"#)
            .err()
            .unwrap_or_default();
        assert!(
            err.contains("labels.a is neither a string nor null"),
            "{err}"
        );
        let err = parse(
            &strict,
            r#"{"attachments": [{"apiVersion": "v1", "kind": "Pod"}]}"#,
        )
        .err()
        .unwrap_or_default();
        assert!(err.contains("not an attachment resource"), "{err}");
    }

    #[test]
    fn a_child_of_a_kind_the_controller_does_not_list_is_refused() {
        let body = json!({"children": [{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}}]}).to_string();
        let e = parse(&spec("InPlace"), &body).err().unwrap_or_default();
        assert!(e.contains("v1/Secret"), "{e}");
    }

    #[test]
    fn strict_answers_refuse_unknown_fields_and_loose_ones_ignore_them() {
        let body = json!({"children": [], "extra": 1}).to_string();
        let mut s = spec("InPlace");
        assert!(parse(&s, &body).is_ok());
        s.strict = true;
        assert!(parse(&s, &body).err().unwrap_or_default().contains("extra"));
    }

    #[test]
    fn status_conditions_are_typed_and_observed_generation_is_the_hosts() {
        let body = json!({"status": {"replicas": 2, "observedGeneration": 9,
            "conditions": [{"type": "Ready", "status": "True"}]}})
        .to_string();
        let answer = parse(&spec("InPlace"), &body).unwrap_or_else(|e| panic!("{e}"));
        let status = answer.status.unwrap_or_else(|| panic!("a status"));
        assert_eq!(status.fields, json!({"replicas": 2}));
        assert_eq!(status.conditions[0].status, ConditionStatus::True);
        assert_eq!(status.conditions[0].reason, "Unspecified");
        let bad =
            json!({"status": {"conditions": [{"type": "Ready", "status": "yes"}]}}).to_string();
        assert!(parse(&spec("InPlace"), &bad).is_err());
    }

    #[test]
    fn finalize_deletes_the_children_no_longer_returned_and_reports_finalized() {
        let observed = Observed {
            parent: json!({"metadata": {"name": "p", "namespace": "ns"}}),
            related: Vec::new(),
            children: vec![(
                Gvk::new("v1", "Pod"),
                vec![pod("a", "v1", true), pod("b", "v1", true)],
            )],
            foreign: Vec::new(),
        };
        let body =
            json!({"children": [desired("a", "v1")], "finalized": false, "resyncAfterSeconds": 2})
                .to_string();
        let answer = parse(&spec("OnDelete"), &body).unwrap_or_else(|e| panic!("{e}"));
        let response = finalize_response(&observed, answer);
        assert!(!response.done);
        assert_eq!(response.requeue_after, Some(Duration::from_secs(2)));
        assert_eq!(response.actions.len(), 1);
        assert_eq!(response.actions[0].target().name, "b");
        assert_eq!(
            response.actions[0].target().namespace.as_deref(),
            Some("ns")
        );
    }

    /// Metacontroller takes a child's `metadata.namespace: ""` as unset (the parent's): a
    /// child the hook still returns with it is neither deleted at finalize nor written again
    /// under `OnDelete`.
    #[test]
    fn an_empty_namespace_on_a_returned_child_is_the_parents() {
        let observed = Observed {
            parent: json!({"metadata": {"name": "p", "namespace": "ns"}}),
            related: Vec::new(),
            children: vec![(Gvk::new("v1", "Pod"), vec![pod("a", "v1", true)])],
            foreign: Vec::new(),
        };
        let mut child = desired("a", "v1");
        child["metadata"]["namespace"] = json!("");
        let body = json!({"children": [child.clone()], "finalized": false}).to_string();
        let answer = parse(&spec("OnDelete"), &body).unwrap_or_else(|e| panic!("{e}"));
        let response = finalize_response(&observed, answer);
        assert_eq!(response.actions.len(), 0, "{:?}", response.actions);
        let (written, kept) = run("OnDelete", vec![child], vec![pod("a", "v2", true)]);
        assert_eq!(
            (written, kept),
            (Vec::<String>::new(), vec!["a".to_string()])
        );
    }

    /// A composite controller's hook that leaves `status` out (or null) once healthy: its old
    /// (error) status must not stay, as Metacontroller replaces the whole status with `{}`; a
    /// decorator's missing status leaves the decorated object's alone.
    #[test]
    fn a_composite_answer_without_status_replaces_it_with_an_empty_one() {
        for body in [r#"{"children":[]}"#, r#"{"children":[],"status":null}"#] {
            let answer = parse(&spec("InPlace"), body).unwrap_or_else(|e| panic!("{e}"));
            let status = answer.status.unwrap_or_else(|| panic!("{body}: no status"));
            assert_eq!(status.fields, json!({}));
            assert!(status.conditions.is_empty());
            let answer = parse(&decorator_spec(false), body).unwrap_or_else(|e| panic!("{e}"));
            assert!(answer.status.is_none(), "{body}");
        }
    }
}
