//! configmap-propagator, tested natively (no Wasm, no cluster).
//!
//! ConfigMap is both an owned kind (the copies) and a related kind (the source) of this module.
//! Most tests build the request the host sends with `Request::from_parts` (copies under owned,
//! Namespaces and the source under related); the harness files them the same way, by the
//! controller ownerReference (see the last reconcile test).

use configmap_propagator::{ConfigMapPropagator, PROPAGATION_LABEL, SOURCE_ANNOTATION};
use serde_json::{Value, json};
use wasmop_sdk::k8s::api::core::v1::{ConfigMap, Namespace};
use wasmop_sdk::testing::{Harness, yaml_documents};
use wasmop_sdk::{
    ConditionStatus, Context, EventType, Gvk, Reconciler, Request, Response, Validation,
};

const CR: &str = include_str!("../fixtures/cr.yaml");
const NAMESPACES: &str = include_str!("../fixtures/observed/namespaces.yaml");
const COPIES: &str = include_str!("../fixtures/observed/copies.yaml");
const SOURCE: &str = include_str!("../fixtures/related/source.yaml");

fn docs(yaml: &str) -> Vec<String> {
    yaml_documents(yaml).iter().map(Value::to_string).collect()
}

/// A reconcile request as the host builds it.
fn request(primary: &str, copies: &[String], namespaces: &[String], sources: &[String]) -> Request {
    Request::from_parts(
        primary.to_string(),
        vec![(Gvk::of::<ConfigMap>(), copies.to_vec())],
        vec![
            (Gvk::of::<Namespace>(), namespaces.to_vec()),
            (Gvk::of::<ConfigMap>(), sources.to_vec()),
        ],
        Context::default(),
    )
}

fn cr() -> String {
    docs(CR).remove(0)
}

fn reconcile(
    primary: &str,
    copies: &[String],
    namespaces: &[String],
    sources: &[String],
) -> Response {
    let req = request(primary, copies, namespaces, sources);
    let out = ConfigMapPropagator::reconcile(&req).expect("reconciles");
    assert!(out.error().is_none(), "{:?}", out.error());
    out
}

fn copy_namespaces(out: &Response) -> Vec<String> {
    out.children::<ConfigMap>()
        .expect("configmaps")
        .iter()
        .map(|c| c.metadata.namespace.clone().unwrap_or_default())
        .collect()
}

fn condition(out: &Response, type_: &str) -> (ConditionStatus, String) {
    let c = out.condition_of(type_).expect("the condition");
    (c.status, c.reason.clone())
}

fn namespace(name: &str, labels: Value) -> String {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
        .to_string()
}

#[test]
fn copies_go_into_exactly_the_matching_namespaces() {
    // The fixtures: team-a and team-b are labelled, sandbox is not, config (the source's own
    // namespace) is labelled too but is never a target.
    let out = reconcile(&cr(), &[], &docs(NAMESPACES), &docs(SOURCE));
    assert_eq!(copy_namespaces(&out), ["team-a", "team-b"]);
    let copies = out.children::<ConfigMap>().expect("configmaps");
    let c = &copies[0];
    assert_eq!(c.metadata.name.as_deref(), Some("shared-settings"));
    let data = c.data.clone().unwrap_or_default();
    assert_eq!(data["log-level"], "info");
    assert_eq!(
        data["region"], "eu-west-1",
        "spec.data overrides the source"
    );
    let labels = c.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels[PROPAGATION_LABEL], "shared-settings");
    assert!(
        !labels.contains_key("example.wasmop.dev/propagate"),
        "a copy is never a source"
    );
    assert_eq!(
        c.metadata.annotations.clone().unwrap_or_default()[SOURCE_ANNOTATION],
        "config/shared-settings"
    );
    let status = &out.status_ref().expect("status").fields;
    assert_eq!(status["targetCount"], 2);
    assert_eq!(status["targetNamespaces"], json!(["team-a", "team-b"]));
    assert_eq!(status["upToDate"], 0);
    assert_eq!(
        condition(&out, "Ready"),
        (ConditionStatus::False, "Propagating".into())
    );
    assert_eq!(condition(&out, "SourceFound").0, ConditionStatus::True);
    assert_eq!(out.events()[0].reason, "Propagating");
    assert!(out.events()[0].message.contains("team-a, team-b"));
}

#[test]
fn with_every_copy_in_place_it_is_ready_and_quiet() {
    let first = reconcile(&cr(), &[], &docs(NAMESPACES), &docs(SOURCE));
    let applied: Vec<String> = first.child_sets()[0].1.clone();
    let out = reconcile(&cr(), &applied, &docs(NAMESPACES), &docs(SOURCE));
    assert_eq!(
        condition(&out, "Ready"),
        (ConditionStatus::True, "Propagated".into())
    );
    assert_eq!(out.status_ref().expect("status").fields["upToDate"], 2);
    assert!(out.events().is_empty(), "{:?}", out.events());
}

#[test]
fn a_namespace_that_stops_matching_loses_its_copy() {
    // The observed copies (fixtures): team-a, team-b and sandbox, which no longer matches.
    let out = reconcile(&cr(), &docs(COPIES), &docs(NAMESPACES), &docs(SOURCE));
    assert_eq!(
        copy_namespaces(&out),
        ["team-a", "team-b"],
        "the complete set leaves sandbox out: the host prunes it"
    );
    assert!(
        out.events()
            .iter()
            .any(|e| e.reason == "Pruning" && e.message.contains("1 copies")),
        "{:?}",
        out.events()
    );
    assert_eq!(condition(&out, "Ready").0, ConditionStatus::False);
}

#[test]
fn a_changed_source_changes_every_copy() {
    let changed = SOURCE.replace("log-level: info", "log-level: debug");
    let out = reconcile(&cr(), &docs(COPIES), &docs(NAMESPACES), &docs(&changed));
    for c in out.children::<ConfigMap>().expect("configmaps") {
        assert_eq!(c.data.unwrap_or_default()["log-level"], "debug");
    }
    // The observed copies still hold the old data: not up to date yet.
    assert_eq!(out.status_ref().expect("status").fields["upToDate"], 0);
}

#[test]
fn a_missing_source_keeps_the_copies_and_says_so() {
    let out = reconcile(&cr(), &docs(COPIES), &docs(NAMESPACES), &[]);
    assert!(
        out.child_sets().is_empty(),
        "no complete set: nothing is pruned"
    );
    assert_eq!(
        condition(&out, "SourceFound"),
        (ConditionStatus::False, "SourceMissing".into())
    );
    let message = &out.condition_of("Ready").expect("Ready").message;
    assert!(message.contains("config/shared-settings"), "{message}");
    assert!(
        message.contains("example.wasmop.dev/propagate=true"),
        "{message}"
    );
    assert!(message.contains("3 existing copies are kept"), "{message}");
    assert_eq!(out.events()[0].type_, EventType::Warning);
    // A ConfigMap of the same name in another namespace is not the source.
    let elsewhere = SOURCE.replace("namespace: config", "namespace: team-a");
    let out = reconcile(&cr(), &[], &docs(NAMESPACES), &docs(&elsewhere));
    assert_eq!(condition(&out, "SourceFound").0, ConditionStatus::False);
}

#[test]
fn match_expressions_select_too_and_terminating_namespaces_are_skipped() {
    let mut p = yaml_documents(CR).remove(0);
    p["spec"]["namespaceSelector"] = json!({"matchExpressions": [
        {"key": "tier", "operator": "In", "values": ["web", "api"]},
        {"key": "legacy", "operator": "DoesNotExist"},
    ]});
    let mut gone = yaml_documents(&namespace("d", json!({"tier": "api"}))).remove(0);
    gone["status"] = json!({"phase": "Terminating"});
    let namespaces = [
        namespace("a", json!({"tier": "web"})),
        namespace("b", json!({"tier": "api", "legacy": "yes"})),
        namespace("c", json!({"tier": "db"})),
        gone.to_string(),
        namespace("e", json!({"tier": "api"})),
    ];
    let out = reconcile(&p.to_string(), &[], &namespaces, &docs(SOURCE));
    assert_eq!(copy_namespaces(&out), ["a", "e"]);
}

#[test]
fn an_invalid_selector_touches_no_copy() {
    let mut p = yaml_documents(CR).remove(0);
    p["spec"]["namespaceSelector"] =
        json!({"matchExpressions": [{"key": "tier", "operator": "Near"}]});
    let out = reconcile(
        &p.to_string(),
        &docs(COPIES),
        &docs(NAMESPACES),
        &docs(SOURCE),
    );
    assert!(out.child_sets().is_empty());
    assert_eq!(
        condition(&out, "Ready"),
        (ConditionStatus::False, "InvalidSelector".into())
    );
}

#[test]
fn copies_may_have_another_name() {
    let mut p = yaml_documents(CR).remove(0);
    p["spec"]["targetName"] = json!("settings");
    let out = reconcile(&p.to_string(), &[], &docs(NAMESPACES), &docs(SOURCE));
    let names: Vec<String> = out
        .children::<ConfigMap>()
        .expect("configmaps")
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    assert_eq!(names, ["settings", "settings"]);
}

#[test]
fn the_harness_runs_it_too() {
    // The harness files the observed Namespaces as related; with no source it reports it.
    let out = Harness::<ConfigMapPropagator>::new()
        .primary_yaml(CR)
        .observed_yaml(NAMESPACES)
        .reconcile()
        .expect("reconciles");
    assert_eq!(
        condition(&out, "SourceFound"),
        (ConditionStatus::False, "SourceMissing".into())
    );
}

#[test]
fn the_harness_files_the_source_as_related_and_the_copies_as_owned() {
    let out = Harness::<ConfigMapPropagator>::new()
        .primary_yaml(CR)
        .observed_yaml(NAMESPACES)
        .observed_yaml(SOURCE)
        .observed_yaml(COPIES)
        .reconcile()
        .expect("reconciles");
    assert_eq!(condition(&out, "SourceFound").0, ConditionStatus::True);
    assert!(!copy_namespaces(&out).is_empty());
}

fn denied(v: Validation) -> String {
    match v {
        Validation::Denied { field, .. } => field.unwrap_or_default(),
        allowed => panic!("must be refused, got {allowed:?}"),
    }
}

#[test]
fn validate_checks_names_keys_and_the_selector() {
    let h = Harness::<ConfigMapPropagator>::new().primary_yaml(CR);
    assert_eq!(h.validate_create(), Validation::allow());
    let with = |f: &dyn Fn(&mut Value)| {
        let mut p = yaml_documents(CR).remove(0);
        f(&mut p);
        Harness::<ConfigMapPropagator>::new()
            .primary(&p)
            .validate_create()
    };
    assert_eq!(
        denied(with(&|p| p["spec"]["source"]["name"] = json!("Not_A_Name"))),
        "spec.source.name"
    );
    assert_eq!(
        denied(with(&|p| p["spec"]["targetName"] = json!("-x"))),
        "spec.targetName"
    );
    assert_eq!(
        denied(with(&|p| p["spec"]["data"] = json!({"a key": "v"}))),
        "spec.data"
    );
    assert_eq!(
        denied(with(&|p| p["spec"]["namespaceSelector"] =
            json!({"matchExpressions": [{"key": "k", "operator": "In"}]}))),
        "spec.namespaceSelector"
    );
    match with(&|p| p["spec"]["namespaceSelector"] = json!({})) {
        Validation::Allowed(w) => assert!(w[0].contains("every namespace"), "{w:?}"),
        denied => panic!("{denied:?}"),
    }
}
