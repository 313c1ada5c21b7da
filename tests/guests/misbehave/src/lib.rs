//! A test guest that misbehaves on request. Its primary kind is `test.wasmop.dev/v1 Widget`; it
//! owns ConfigMaps. The WasmReconciler config (or `wasmop test --config`) picks the behaviour:
//! `{"mode": "good" | "loop" | "memory" | "panic" | "garbage" | "oversized" | "undeclared" |
//! "error" | "foreign-namespace" | "slow" | "sleep" | "flood" | "aliased" | "huge-warning" |
//! "forge-panic" | "forge-error" | "forge" | "entropy" | "remember"}`;
//! the primary's `spec.mode`, when present, wins (so one reconciler can serve well-behaved and
//! misbehaving objects).
//!
//! - `sleep`: blocks in a WASI sleep (reconcile: the primary's `spec.sleepSeconds`, default 20 s;
//!   validate: 20 s), to escape an epoch deadline or to hold a sandbox slot.
//! - `flood`: 8 children of 1 MiB each (8 MiB of output, within a 32 MiB memory cap).
//! - `aliased`: 200 children whose strings all alias one 1 MiB buffer (200 MiB for the host to
//!   copy out of a guest that holds 1 MiB).
//! - `huge-warning` (validate): allows with a 1 MiB warning.
//! - `forge-panic`, `forge-error` (reconcile) and `forge` (validate: a denial and, in the
//!   field, a warning-like text): text with a line break, a forged log line and a terminal escape,
//!   which the host must render inert.
//! - `remember` (reconcile): one ConfigMap holding what a previous call could have left in the
//!   sandbox's memory (`calls`: a counter in the memory image that starts at 7 and each call
//!   increments; `dirtyGrownBytes`: non-zero bytes in 16 pages grown past the heap, which each
//!   call then fills; `grownAt`: the page they start at).
//! - `entropy` (reconcile): one ConfigMap holding what the sandbox's clocks and randomness gave
//!   (`wall`: the wall clock in ns since the epoch; `elapsed`: monotonic ns across the reads;
//!   `hashed`: a std `RandomState` hash, seeded by `wasi:random/insecure-seed`).
//!
//! The `huge-metadata` feature builds a module whose `metadata()` name is 2 MiB long.

// wit-bindgen's generated export glue is `unsafe` (raw ABI functions).
#[cfg(target_family = "wasm")]
#[allow(unsafe_code)]
mod guest {
    wit_bindgen::generate!({ world: "module", path: "../../../wit" });

    use exports::wasmop::reconciler::guest::Guest;
    use wasmop::reconciler::types::*;

    struct Misbehave;

    /// Text that would forge a host log line and clear a terminal if it were printed as is.
    const FORGED: &str = "forged\n2026-11-23T00:00:00Z  INFO wasmop: all good\x1b[2J\u{202e}";

    fn mode(primary: &serde_json::Value, config: &str) -> String {
        let config: serde_json::Value = serde_json::from_str(config).unwrap_or_default();
        primary
            .pointer("/spec/mode")
            .or_else(|| config.get("mode"))
            .and_then(|m| m.as_str())
            .unwrap_or("good")
            .to_string()
    }

    fn config_map(name: &str, namespace: Option<&str>, data: serde_json::Value) -> String {
        let mut meta = serde_json::json!({ "name": name });
        if let Some(ns) = namespace {
            meta["namespace"] = ns.into();
        }
        serde_json::json!({ "apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data })
            .to_string()
    }

    /// Starts at 7 (a data segment, so part of the memory image); `remember` counts calls in it.
    static CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(7);

    /// What a previous call left in memory: the counter in the memory image, and 16 pages grown
    /// past the heap's end (read, then written with a marker).
    fn remember() -> serde_json::Value {
        let calls = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let old_pages = core::arch::wasm32::memory_grow(0, 16);
        if old_pages == usize::MAX {
            return serde_json::json!({ "calls": calls.to_string(), "grown": "refused" });
        }
        let grown = (old_pages << 16) as *mut u8;
        let len = 16 << 16;
        // SAFETY: the 16 pages just grown belong to no allocation; they are read and written
        // here only, within their bounds.
        let page = unsafe { std::slice::from_raw_parts_mut(grown, len) };
        let dirty = page.iter().filter(|b| **b != 0).count();
        page.fill(0xa5);
        serde_json::json!({
            "calls": calls.to_string(),
            "grownAt": old_pages.to_string(),
            "dirtyGrownBytes": dirty.to_string(),
        })
    }

    fn children(objects: Vec<String>) -> Vec<ChildSet> {
        vec![ChildSet {
            kind: Gvk {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
            },
            objects,
        }]
    }

    impl Guest for Misbehave {
        fn metadata() -> ModuleMetadata {
            ModuleMetadata {
                name: if cfg!(feature = "huge-metadata") {
                    "m".repeat(2 << 20)
                } else {
                    "misbehave".into()
                },
                version: if cfg!(feature = "fragile") {
                    "0.1.0-fragile".into()
                } else {
                    "0.1.0".into()
                },
                primary: Gvk {
                    api_version: "test.wasmop.dev/v1".into(),
                    kind: "Widget".into(),
                },
                owns: vec![Gvk {
                    api_version: "v1".into(),
                    kind: "ConfigMap".into(),
                }],
                related: vec![],
                finalizes: false,
                validates: true,
            }
        }

        fn reconcile(request: ReconcileRequest) -> Result<ReconcileResponse, ReconcileError> {
            let primary: serde_json::Value =
                serde_json::from_str(&request.primary).map_err(|e| ReconcileError {
                    message: e.to_string(),
                })?;
            let name = primary
                .pointer("/metadata/name")
                .and_then(|n| n.as_str())
                .unwrap_or("widget")
                .to_string();
            if cfg!(feature = "fragile")
                && primary
                    .pointer("/metadata/labels/test.wasmop.dev~1fragile")
                    .is_some()
            {
                panic!("fragile build: cannot reconcile {name}");
            }
            let mut response = ReconcileResponse {
                children: vec![],
                actions: vec![],
                status: None,
                events: vec![],
                requeue_after_ms: None,
            };
            match mode(&primary, &request.context.config).as_str() {
                "loop" => {
                    let mut n: u64 = 0;
                    loop {
                        n = std::hint::black_box(n.wrapping_add(1));
                    }
                }
                "sleep" => {
                    let seconds = primary
                        .pointer("/spec/sleepSeconds")
                        .and_then(|s| s.as_u64())
                        .unwrap_or(20);
                    std::thread::sleep(std::time::Duration::from_secs(seconds))
                }
                "flood" => {
                    let big = "x".repeat(1 << 20);
                    response.children = children(
                        (0..8)
                            .map(|i| {
                                config_map(
                                    &format!("{name}-{i}"),
                                    None,
                                    serde_json::json!({ "big": &big }),
                                )
                            })
                            .collect(),
                    );
                    return Ok(response);
                }
                "aliased" => {
                    // Hostile on purpose: 200 Strings sharing one buffer. The canonical ABI copies
                    // each one; the guest holds 1 MiB. (Its post-return would free the buffer 200
                    // times; the host must stop copying long before that matters.)
                    let mut big = std::mem::ManuallyDrop::new(
                        config_map(
                            &name,
                            None,
                            serde_json::json!({ "big": "x".repeat(1 << 20) }),
                        )
                        .into_bytes(),
                    );
                    let (ptr, len) = (big.as_mut_ptr(), big.len());
                    response.children = children(
                        (0..200)
                            // SAFETY: none; every String aliases `big`. Nothing reads or frees
                            // them in the guest before the host has copied (or refused) them.
                            .map(|_| unsafe { String::from_raw_parts(ptr, len, len) })
                            .collect(),
                    );
                    return Ok(response);
                }
                "slow" => {
                    // 100 ms of the sandbox clock (100,000 readings: it advances 1 µs per
                    // reading), then a normal answer.
                    let start = std::time::Instant::now();
                    while start.elapsed() < std::time::Duration::from_millis(100) {
                        std::hint::black_box(());
                    }
                }
                "memory" => {
                    let mut hoard: Vec<Vec<u8>> = Vec::new();
                    loop {
                        hoard.push(vec![7u8; 16 << 20]);
                        std::hint::black_box(&hoard);
                    }
                }
                "panic" => panic!("deliberate panic while reconciling {name}"),
                "forge-panic" => panic!("{FORGED}"),
                "forge-error" => {
                    return Err(ReconcileError {
                        message: FORGED.into(),
                    });
                }
                "garbage" => {
                    response.children = children(vec![
                        "{\"apiVersion\": \"v1\", \"kind\": \"ConfigMap\", oops".into(),
                    ]);
                    return Ok(response);
                }
                "oversized" => {
                    let big = "x".repeat(3 << 20);
                    response.children = children(vec![config_map(
                        &name,
                        None,
                        serde_json::json!({ "big": big }),
                    )]);
                    return Ok(response);
                }
                "undeclared" => {
                    response.children = vec![ChildSet {
                        kind: Gvk { api_version: "v1".into(), kind: "Secret".into() },
                        objects: vec![serde_json::json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}}).to_string()],
                    }];
                    return Ok(response);
                }
                "foreign-namespace" => {
                    response.children = children(vec![config_map(
                        &name,
                        Some("kube-system"),
                        serde_json::json!({}),
                    )]);
                    return Ok(response);
                }
                "entropy" => {
                    let started = std::time::Instant::now();
                    let wall = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.as_nanos())
                        .unwrap_or_default();
                    let hashed = std::hash::BuildHasher::hash_one(
                        &std::collections::hash_map::RandomState::new(),
                        &name,
                    );
                    let data = serde_json::json!({
                        "wall": wall.to_string(),
                        "elapsed": started.elapsed().as_nanos().to_string(),
                        "hashed": hashed.to_string(),
                    });
                    response.children = children(vec![config_map(&name, None, data)]);
                    return Ok(response);
                }
                "remember" => {
                    let data = remember();
                    response.children = children(vec![config_map(&name, None, data)]);
                    return Ok(response);
                }
                "error" => {
                    return Err(ReconcileError {
                        message: format!("widget {name} cannot be reconciled: deliberate error"),
                    });
                }
                _ => {}
            }
            // The attempt only when asked: a status that changes with retries is not steady.
            let mut fields = serde_json::json!({ "reconciled": true });
            if primary.pointer("/spec/echoAttempt") == Some(&serde_json::Value::Bool(true)) {
                fields["attempt"] = request.context.attempt.into();
            }
            response.children = children(vec![config_map(
                &format!("{name}-out"),
                None,
                serde_json::json!({ "owner": name }),
            )]);
            response.status = Some(Status {
                fields: fields.to_string(),
                conditions: vec![Condition {
                    type_: "Ready".into(),
                    status: ConditionStatus::True,
                    reason: "Reconciled".into(),
                    message: format!("reconciled {name}"),
                }],
            });
            wasmop::reconciler::host::log(
                wasmop::reconciler::host::LogLevel::Info,
                &format!("reconciled {name}"),
            );
            Ok(response)
        }

        fn finalize(_request: ReconcileRequest) -> Result<FinalizeResponse, ReconcileError> {
            Ok(FinalizeResponse {
                done: true,
                actions: vec![],
                status: None,
                events: vec![],
                requeue_after_ms: None,
            })
        }

        fn validate(request: ValidateRequest) -> ValidateResponse {
            let new: serde_json::Value = serde_json::from_str(&request.new).unwrap_or_default();
            match mode(&new, &request.config).as_str() {
                "loop" => loop {
                    std::hint::black_box(());
                },
                "sleep" => {
                    std::thread::sleep(std::time::Duration::from_secs(20));
                    ValidateResponse::Allowed(vec![])
                }
                "huge-warning" => ValidateResponse::Allowed(vec!["w".repeat(1 << 20)]),
                "forge" => ValidateResponse::Denied(Denial {
                    message: FORGED.into(),
                    field: Some(FORGED.into()),
                }),
                "forbidden" => ValidateResponse::Denied(Denial {
                    message: "widgets in forbidden mode are refused".into(),
                    field: Some("spec.mode".into()),
                }),
                _ => ValidateResponse::Allowed(vec![]),
            }
        }
    }

    export!(Misbehave);
}
