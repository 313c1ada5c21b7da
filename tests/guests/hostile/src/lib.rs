//! A test guest that tries to touch what it does not own. Its primary kind is
//! `test.wasmop.dev/v1 Widget`; it owns ConfigMaps and finalizes. The WasmReconciler config picks
//! the behaviour (the primary's `spec.mode` wins):
//! - `good` (default): one child ConfigMap `<name>-child`.
//! - `hostile`: the child, plus one intent the host must refuse, picked by the primary's
//!   `spec.attack`: `module-config-map` (a merge patch of the module's own ConfigMap, config
//!   `moduleConfigMap`), `root-ca` (a delete of `kube-root-ca.crt`), `delete-victim` (a delete of another
//!   Widget, config `victim`), `strip-merge` / `strip-json` (merge and JSON patches removing the
//!   primary's finalizers), `event` (an Event about `kube-root-ca.crt`).
//! - `finalize-delete`: finalize deletes every observed child ConfigMap and reports done at once
//!   (its ServiceAccount may be denied the delete).

// wit-bindgen's generated export glue is `unsafe` (raw ABI functions).
#[cfg(target_family = "wasm")]
#[allow(unsafe_code)]
mod guest {
    wit_bindgen::generate!({ world: "module", path: "../../../wit" });

    use exports::wasmop::reconciler::guest::Guest;
    use wasmop::reconciler::types::*;

    struct Hostile;

    fn mode(primary: &serde_json::Value, config: &serde_json::Value) -> String {
        primary
            .pointer("/spec/mode")
            .or_else(|| config.get("mode"))
            .and_then(|m| m.as_str())
            .unwrap_or("good")
            .to_string()
    }

    fn config_map() -> Gvk {
        Gvk {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
        }
    }

    fn target(api_version: &str, kind: &str, name: &str) -> ObjectRef {
        ObjectRef {
            api_version: api_version.into(),
            kind: kind.into(),
            namespace: None,
            name: name.into(),
        }
    }

    fn widget(name: &str) -> ObjectRef {
        target("test.wasmop.dev/v1", "Widget", name)
    }

    fn parse(text: &str) -> Result<serde_json::Value, ReconcileError> {
        serde_json::from_str(text).map_err(|e| ReconcileError {
            message: e.to_string(),
        })
    }

    fn name_of(object: &serde_json::Value) -> String {
        object
            .pointer("/metadata/name")
            .and_then(|n| n.as_str())
            .unwrap_or_default()
            .to_string()
    }

    /// The attack `attack` against primary `name`: actions and Events.
    fn attack(attack: &str, name: &str, config: &serde_json::Value) -> (Vec<Action>, Vec<Event>) {
        let text = |k: &str| config.get(k).and_then(|v| v.as_str()).unwrap_or("x");
        let patch = |target: ObjectRef, body: serde_json::Value| Patch {
            target,
            body: body.to_string(),
        };
        let delete = |target: ObjectRef| {
            Action::Delete(DeleteIntent {
                target,
                propagation: Propagation::Background,
            })
        };
        let action = match attack {
            "module-config-map" => Action::MergePatch(patch(
                target("v1", "ConfigMap", text("moduleConfigMap")),
                serde_json::json!({"metadata": {"labels": {"pwned": "yes"}}}),
            )),
            "root-ca" => delete(target("v1", "ConfigMap", "kube-root-ca.crt")),
            "delete-victim" => delete(widget(text("victim"))),
            "strip-merge" => Action::MergePatch(patch(
                widget(name),
                serde_json::json!({"metadata": {"finalizers": null}}),
            )),
            "strip-json" => Action::JsonPatch(patch(
                widget(name),
                serde_json::json!([{"op": "remove", "path": "/metadata/finalizers"}]),
            )),
            _ => {
                return (
                    vec![],
                    vec![Event {
                        type_: EventType::Normal,
                        reason: "Forged".into(),
                        message: "an Event about an object that is not mine".into(),
                        action: "Forge".into(),
                        regarding: Some(target("v1", "ConfigMap", "kube-root-ca.crt")),
                    }],
                );
            }
        };
        (vec![action], vec![])
    }

    impl Guest for Hostile {
        fn metadata() -> ModuleMetadata {
            ModuleMetadata {
                name: "hostile".into(),
                version: "0.1.0".into(),
                primary: Gvk {
                    api_version: "test.wasmop.dev/v1".into(),
                    kind: "Widget".into(),
                },
                owns: vec![config_map()],
                related: vec![],
                finalizes: true,
                validates: false,
            }
        }

        fn reconcile(request: ReconcileRequest) -> Result<ReconcileResponse, ReconcileError> {
            let primary = parse(&request.primary)?;
            let config = parse(&request.context.config).unwrap_or_default();
            let name = name_of(&primary);
            let child = serde_json::json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": format!("{name}-child")},
                "data": {"owner": name},
            });
            let mut response = ReconcileResponse {
                children: vec![ChildSet {
                    kind: config_map(),
                    objects: vec![child.to_string()],
                }],
                actions: vec![],
                status: None,
                events: vec![],
                requeue_after_ms: None,
            };
            if mode(&primary, &config) == "hostile" {
                let which = primary
                    .pointer("/spec/attack")
                    .and_then(|a| a.as_str())
                    .unwrap_or("event");
                (response.actions, response.events) = attack(which, &name, &config);
            }
            Ok(response)
        }

        fn finalize(request: ReconcileRequest) -> Result<FinalizeResponse, ReconcileError> {
            let primary = parse(&request.primary)?;
            let config = parse(&request.context.config).unwrap_or_default();
            let mut actions = Vec::new();
            if mode(&primary, &config) == "finalize-delete" {
                for group in &request.owned {
                    for object in &group.objects {
                        let object = parse(object)?;
                        actions.push(Action::Delete(DeleteIntent {
                            target: target("v1", "ConfigMap", &name_of(&object)),
                            propagation: Propagation::Background,
                        }));
                    }
                }
            }
            Ok(FinalizeResponse {
                done: true,
                actions,
                status: None,
                events: vec![],
                requeue_after_ms: None,
            })
        }

        fn validate(_request: ValidateRequest) -> ValidateResponse {
            ValidateResponse::Allowed(vec![])
        }
    }

    export!(Hostile);
}
