//! The sandbox against real modules: misbehaving guests become typed errors within their
//! limits, and the same engine goes on to run good modules correctly.

use std::time::{Duration, Instant};

use wasmop::contract::{Context, Gvk, KindObjects, ReconcileRequest, Trigger};
use wasmop::engine::{
    CallError, Compiled, Engine, EngineConfig, Limits, LoadError, Module, VALIDATE_OUTPUT_MAX,
    hostcall_fuel,
};
use wasmop_test_modules as modules;

fn engine() -> Engine {
    Engine::new(&EngineConfig::default()).expect("engine")
}

fn load(engine: &Engine, path: &str) -> Module {
    engine
        .load(&modules::bytes(path), &Limits::default())
        .unwrap_or_else(|e| panic!("loading {path}: {e}"))
}

fn widget(mode: &str) -> ReconcileRequest {
    ReconcileRequest {
        primary: serde_json::json!({
            "apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
            "metadata": {"name": format!("w-{mode}"), "namespace": "ns", "uid": "u"},
            "spec": {"mode": mode, "echoAttempt": true}
        })
        .to_string(),
        owned: vec![KindObjects {
            kind: Gvk::new("v1", "ConfigMap"),
            objects: vec![],
        }],
        related: vec![],
        context: Context {
            reconciler: "r".into(),
            trigger: Trigger::PrimaryChanged,
            attempt: 3,
            config: "{}".into(),
            now_unix_ms: 0,
        },
    }
}

/// Limits whose deadline no call here meets, however loaded the machine (a `make test` run got
/// `Deadline` for the `memory` widget at 300 ms): a test of the deadline sets its own.
fn limits() -> Limits {
    Limits {
        deadline: Duration::from_secs(60),
        memory_bytes: 32 << 20,
        output_bytes: 1 << 20,
        log_lines: 10,
    }
}

/// [`limits`] with `deadline`.
fn with_deadline(deadline: Duration) -> Limits {
    Limits {
        deadline,
        ..limits()
    }
}

/// An async runtime of one thread (with timers): a guest awaited on it shares that thread with
/// the runtime's other tasks.
fn one_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime")
}

fn assert_good(module: &Module) {
    let out = module.reconcile(widget("good"), &limits());
    let response = out.result.expect("the good widget reconciles");
    assert_eq!(response.children.len(), 1);
    assert_eq!(
        response.children[0].objects[0]["metadata"]["name"],
        "w-good-out"
    );
    let status = response.status.expect("status");
    assert_eq!(
        status.fields["attempt"], 3,
        "the context reaches the module"
    );
    assert!(out.stats.memory_peak > 0);
}

#[test]
fn each_misbehaviour_is_a_typed_error_and_the_engine_keeps_working() {
    let engine = engine();
    let module = load(&engine, modules::MISBEHAVE);
    assert_good(&module);

    let started = Instant::now();
    let short = Limits {
        deadline: Duration::from_millis(300),
        ..limits()
    };
    let err = module
        .reconcile(widget("loop"), &short)
        .result
        .expect_err("must fail");
    let took = started.elapsed();
    assert_eq!(
        err,
        CallError::Deadline {
            deadline: Duration::from_millis(300)
        }
    );
    // An endless loop, stopped: well before the seconds a loaded machine could add.
    assert!(took < Duration::from_secs(5), "stopped after {took:?}");
    assert_good(&module);

    let err = module
        .reconcile(widget("memory"), &limits())
        .result
        .expect_err("must fail");
    assert!(
        matches!(err, CallError::Memory { limit, requested } if limit == 32 << 20 && requested > limit),
        "{err:?}"
    );
    assert_good(&module);

    let err = module
        .reconcile(widget("panic"), &limits())
        .result
        .expect_err("must fail");
    match &err {
        CallError::Panic { message } => assert!(
            message.contains("deliberate panic while reconciling w-panic"),
            "{message}"
        ),
        other => panic!("expected a panic, got {other:?}"),
    }
    assert_good(&module);

    let err = module
        .reconcile(widget("garbage"), &limits())
        .result
        .expect_err("must fail");
    match &err {
        CallError::Malformed { detail } => {
            assert!(
                detail.contains("children[v1/ConfigMap][0] is not JSON"),
                "{detail}"
            )
        }
        other => panic!("expected malformed output, got {other:?}"),
    }
    assert_good(&module);

    let err = module
        .reconcile(widget("oversized"), &limits())
        .result
        .expect_err("must fail");
    assert!(
        matches!(err, CallError::OutputTooLarge { size, limit } if limit == 1 << 20 && size > limit),
        "{err:?}"
    );
    assert_good(&module);

    let err = module
        .reconcile(widget("error"), &limits())
        .result
        .expect_err("must fail");
    assert_eq!(
        err,
        CallError::Module {
            message: "widget w-error cannot be reconciled: deliberate error".into()
        }
    );

    // A child of a kind the module did not declare is not an engine error: the output is well
    // formed. Intent validation refuses it (see the intents tests and `wasmop test`).
    let response = module
        .reconcile(widget("undeclared"), &limits())
        .result
        .expect("well formed");
    assert_eq!(response.children[0].kind, Gvk::new("v1", "Secret"));

    // And a different good module in the same engine.
    let image_updater = load(&engine, modules::IMAGE_UPDATER);
    assert_eq!(image_updater.metadata().name, "image-updater");
    assert_good(&module);
}

#[test]
fn a_deadline_in_validate_is_enforced_too() {
    let engine = engine();
    let module = load(&engine, modules::MISBEHAVE);
    let request = wasmop::contract::ValidateRequest {
        operation: wasmop::contract::Operation::Create,
        old: None,
        new: serde_json::json!({"spec": {"mode": "loop"}}).to_string(),
        config: "{}".into(),
    };
    let limits = Limits {
        deadline: Duration::from_millis(50),
        ..limits()
    };
    let started = Instant::now();
    let err = module
        .validate(request, &limits)
        .result
        .expect_err("must fail");
    assert_eq!(
        err,
        CallError::Deadline {
            deadline: Duration::from_millis(50)
        }
    );
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn calls_from_many_threads_are_isolated() {
    let engine = engine();
    let module = load(&engine, modules::MISBEHAVE);
    std::thread::scope(|s| {
        for i in 0..8 {
            let module = module.clone();
            s.spawn(move || {
                for _ in 0..5 {
                    let mode = if i % 2 == 0 { "good" } else { "panic" };
                    let out = module.reconcile(widget(mode), &limits());
                    assert_eq!(out.result.is_ok(), mode == "good", "{:?}", out.result);
                }
            });
        }
    });
    assert_good(&module);
}

#[test]
fn bad_modules_are_refused_with_what_to_do() {
    let engine = engine();
    let err = engine
        .load(b"definitely not wasm", &Limits::default())
        .expect_err("must fail");
    assert!(matches!(err, LoadError::NotWasm { .. }), "{err}");
    assert!(err.to_string().contains("wasm32-wasip2"), "{err}");

    // The smallest valid core module.
    let err = engine
        .load(b"\0asm\x01\0\0\0", &Limits::default())
        .expect_err("must fail");
    assert!(matches!(err, LoadError::CoreModule), "{err}");

    let err = engine
        .load(&modules::bytes(modules::WRONG_VERSION), &Limits::default())
        .expect_err("must fail");
    match &err {
        LoadError::VersionMismatch { found, supported } => {
            assert_eq!(found, "wasmop:reconciler/guest@0.2.0");
            assert_eq!(*supported, "0.1.0");
        }
        other => panic!("expected a version mismatch, got {other}"),
    }

    // A truncated component does not compile.
    let mut bytes = modules::bytes(modules::MISBEHAVE);
    bytes.truncate(bytes.len() / 2);
    let err = engine
        .load(&bytes, &Limits::default())
        .expect_err("must fail");
    assert!(matches!(err, LoadError::Compile(_)), "{err}");

    // The engine still loads good modules.
    load(&engine, modules::MISBEHAVE);
}

#[test]
fn compiled_modules_are_cached_on_disk() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = EngineConfig {
        cache_dir: Some(dir.path().to_path_buf()),
        ..EngineConfig::default()
    };
    let bytes = modules::bytes(modules::MISBEHAVE);
    let first = load_with(&config, &bytes);
    assert_eq!(first.compiled(), Compiled::Fresh);
    // A new engine (as after a restart) finds the artifact.
    let second = load_with(&config, &bytes);
    assert_eq!(second.compiled(), Compiled::FromCache);
    assert_eq!(first.sha256(), second.sha256());
    assert_good(&second);
    // A corrupted artifact is a miss, not a crash. (Corrupted between runs: the modules map
    // their entry, which the cache never changes in place while it is mapped.)
    drop((first, second));
    for entry in std::fs::read_dir(dir.path()).expect("read_dir").flatten() {
        if entry.path().extension().is_some_and(|e| e == "cwasm") {
            std::fs::write(entry.path(), b"garbage").expect("corrupt");
        }
    }
    let third = load_with(&config, &bytes);
    assert_eq!(third.compiled(), Compiled::Fresh);
    assert_good(&third);
}

/// Loads `bytes` in a new engine with `config` (a new engine: as after a restart).
fn load_with(config: &EngineConfig, bytes: &[u8]) -> Module {
    Engine::new(config)
        .expect("engine")
        .load(bytes, &Limits::default())
        .expect("load")
}

/// The `.cwasm` entries in `dir`.
fn cache_entries(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("read_dir")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "cwasm"))
        .collect();
    entries.sort();
    entries
}

/// Whether this process maps `file` (`/proc/self/maps` names the file of every file mapping).
#[cfg(target_os = "linux")]
fn mapped(file: &std::path::Path) -> bool {
    let file = file.canonicalize().expect("canonical path");
    let maps = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps");
    maps.lines().any(|l| l.ends_with(&*file.to_string_lossy()))
}

#[cfg(target_os = "linux")]
#[test]
fn compiled_code_is_mapped_from_the_cache_file_not_copied() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = EngineConfig {
        cache_dir: Some(dir.path().to_path_buf()),
        ..EngineConfig::default()
    };
    let bytes = modules::bytes(modules::MISBEHAVE);
    // A fresh compile is written to the cache first, then mapped from there.
    let first = load_with(&config, &bytes);
    assert_eq!(first.compiled(), Compiled::Fresh);
    let entries = cache_entries(dir.path());
    let [entry] = entries.as_slice() else {
        panic!("one entry expected: {entries:?}");
    };
    assert!(mapped(entry), "the fresh compile does not map {entry:?}");
    let mode = std::fs::metadata(entry).expect("stat").permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "entries are private to their owner");
    assert_good(&first);
    drop(first);
    assert!(
        !mapped(entry),
        "{entry:?} is still mapped after its module was dropped"
    );

    // A load from the cache (as after a restart) maps the entry too.
    let second = load_with(&config, &bytes);
    assert_eq!(second.compiled(), Compiled::FromCache);
    assert!(mapped(entry), "the cache hit does not map {entry:?}");
    assert_good(&second);
    drop(second);

    // An entry that other users could change is read into memory and checked there: still a
    // hit, never mapped.
    std::fs::set_permissions(entry, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let third = load_with(&config, &bytes);
    assert_eq!(third.compiled(), Compiled::FromCache);
    assert!(
        !mapped(entry),
        "{entry:?} is writable by others, yet mapped"
    );
    assert_good(&third);
}

fn validate_request(mode: &str) -> wasmop::contract::ValidateRequest {
    wasmop::contract::ValidateRequest {
        operation: wasmop::contract::Operation::Create,
        old: None,
        new: serde_json::json!({"spec": {"mode": mode}}).to_string(),
        config: "{}".into(),
    }
}

fn small_engine(instances: u32) -> Engine {
    Engine::new(&EngineConfig {
        max_instances: instances,
        max_calls: instances,
        ..EngineConfig::default()
    })
    .expect("engine")
}

#[test]
fn a_guest_sleeping_in_wasi_is_stopped_at_its_deadline_and_frees_its_sandbox() {
    const N: usize = 2;
    let engine = small_engine(N as u32);
    let module = load(&engine, modules::MISBEHAVE);
    let one_second = with_deadline(Duration::from_secs(1));
    // N guests asleep (20 s) at once, in reconcile and in validate: each is stopped at its
    // 1 s deadline, not when it wakes up.
    std::thread::scope(|s| {
        for i in 0..N {
            let module = module.clone();
            s.spawn(move || {
                let started = Instant::now();
                let err = if i % 2 == 0 {
                    module.reconcile(widget("sleep"), &one_second).result.err()
                } else {
                    module
                        .validate(validate_request("sleep"), &one_second)
                        .result
                        .err()
                };
                let took = started.elapsed();
                assert_eq!(
                    err,
                    Some(CallError::Deadline {
                        deadline: Duration::from_secs(1)
                    })
                );
                assert!(took >= Duration::from_secs(1), "stopped early: {took:?}");
                assert!(took < Duration::from_secs(5), "stopped after {took:?}");
            });
        }
    });
    // Their sandboxes are free again: N + 1 calls at once all succeed (one waits its turn).
    let generous = Limits {
        deadline: Duration::from_secs(10),
        ..limits()
    };
    std::thread::scope(|s| {
        for _ in 0..=N {
            let module = module.clone();
            s.spawn(move || {
                let out = module.reconcile(widget("good"), &generous);
                assert!(out.result.is_ok(), "{:?}", out.result);
            });
        }
    });
}

/// Awaited on an async runtime, a call runs its guest on the task's own thread: a guest that
/// never returns must give that thread back to the runtime's other tasks at every epoch tick,
/// and still be stopped at its deadline. On a runtime of one thread, a 10 ms timer of another
/// task fires while the guest spins (without the yields, only after the 2 s deadline).
#[test]
fn an_async_call_yields_its_thread_to_other_tasks_until_its_deadline() {
    let engine = engine();
    let module = load(&engine, modules::MISBEHAVE);
    let runtime = one_thread_runtime();
    let two_seconds = with_deadline(Duration::from_secs(2));
    let (called, timer_fired) = runtime.block_on(async {
        let call = async {
            let out = module.reconcile_async(widget("loop"), &two_seconds).await;
            (out.result, Instant::now())
        };
        let timer = async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            Instant::now()
        };
        tokio::join!(call, timer)
    });
    let (result, call_ended) = called;
    assert_eq!(
        result.expect_err("an endless loop"),
        CallError::Deadline {
            deadline: Duration::from_secs(2)
        }
    );
    assert!(
        timer_fired < call_ended,
        "the other task ran only after the guest was stopped"
    );
    // The same module goes on serving, awaited or not.
    let out = runtime.block_on(module.reconcile_async(widget("good"), &limits()));
    assert!(out.result.is_ok(), "{:?}", out.result);
    assert_good(&module);
}

/// A guest's deadline bounds its own work, not the host's: the time a call spends given back
/// to the runtime at its ticks, while other tasks run, is not charged to it. On a runtime of one
/// thread, a task that holds the thread for 10 ms each time it runs (as a flood of TLS
/// handshakes does on a loaded host) sits beside a guest of bounded work (the `slow` widget,
/// 100 ms of its sandbox clock) with a 1 s deadline: the guest finishes. Charged for its waits,
/// it ran past its deadline (as the review of the e2e flood test did on CI, 2026-12-01).
#[test]
fn the_time_a_guest_is_given_back_to_other_tasks_is_not_charged_to_its_deadline() {
    let engine = engine();
    let module = load(&engine, modules::MISBEHAVE);
    let runtime = one_thread_runtime();
    let one_second = Limits {
        deadline: Duration::from_secs(1),
        ..limits()
    };
    let done = std::sync::atomic::AtomicBool::new(false);
    let (result, hogged) = runtime.block_on(async {
        let call = async {
            let out = module.reconcile_async(widget("slow"), &one_second).await;
            done.store(true, std::sync::atomic::Ordering::Relaxed);
            out.result
        };
        let hog = async {
            let mut turns = 0u32;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(10));
                turns += 1;
                tokio::task::yield_now().await;
            }
            turns
        };
        tokio::join!(call, hog)
    });
    assert!(
        result.is_ok(),
        "the guest's own work fits its deadline ({hogged} turns of the other task): {result:?}"
    );
    assert!(
        hogged > 1,
        "the other task ran while the guest did: {hogged}"
    );
}

#[test]
fn a_call_that_finds_every_sandbox_busy_waits_and_is_not_the_modules_fault() {
    let engine = small_engine(1);
    let module = load(&engine, modules::MISBEHAVE);
    // Another reconciler holds the only slot for longer than this call's deadline.
    let held = engine
        .queue()
        .acquire("other", Instant::now() + Duration::from_secs(60), 0)
        .expect("the only slot");
    let short = Limits {
        deadline: Duration::from_millis(300),
        ..limits()
    };
    let out = module.reconcile(widget("good"), &short);
    assert!(
        out.stats.queued >= Duration::from_millis(300),
        "the call waited its deadline for a slot: {:?}",
        out.stats.queued
    );
    let err = out.result.expect_err("no slot");
    assert_eq!(
        err,
        CallError::Queued {
            deadline: Duration::from_millis(300),
            slots: 1
        }
    );
    assert!(!err.is_module_fault());
    assert_eq!(err.reason(), "SandboxBusy");
    assert_eq!(engine.queue().waiting(), 0);
    drop(held);
    assert_good(&module);
    // A slot freed while the call waits is taken: the call runs.
    let held = engine
        .queue()
        .acquire("other", Instant::now() + Duration::from_secs(60), 0)
        .expect("the only slot");
    let freeing = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        drop(held);
    });
    let waited = Limits {
        deadline: Duration::from_secs(30),
        ..limits()
    };
    let out = module.reconcile(widget("good"), &waited);
    assert!(out.result.is_ok(), "{:?}", out.result);
    freeing.join().expect("the freeing thread");
    // The module's own failures still are its fault.
    assert!(
        module
            .reconcile(widget("panic"), &limits())
            .result
            .expect_err("panics")
            .is_module_fault()
    );
}

#[test]
fn outputs_are_capped_while_they_are_copied_out_of_the_guest() {
    let engine = engine();
    let module = load(&engine, modules::MISBEHAVE);
    let cap = limits().output_bytes;
    // What is asserted is the output cap, not the deadline (see `limits`): on a loaded machine
    // the guest took more than 300 ms to build its 8 MiB (a `make test` run got `Deadline`).
    let roomy = limits();
    // 8 MiB of distinct children, and 200 MiB of children aliasing one 1 MiB buffer: the host
    // stops copying at the hostcall fuel (about twice the cap), not after the whole response.
    for mode in ["flood", "aliased"] {
        let err = module
            .reconcile(widget(mode), &roomy)
            .result
            .expect_err("over the cap");
        match err {
            CallError::OutputTooLarge { size, limit } => {
                assert_eq!(limit, cap, "{mode}");
                assert!(size > cap && size <= hostcall_fuel(cap), "{mode}: {size}");
            }
            other => panic!("{mode}: expected OutputTooLarge, got {other:?}"),
        }
        assert_good(&module);
    }
    // validate's verdict is capped too (it goes into an AdmissionReview response).
    let err = module
        .validate(validate_request("huge-warning"), &limits())
        .result
        .expect_err("over the cap");
    assert!(
        matches!(err, CallError::OutputTooLarge { limit, .. } if limit == VALIDATE_OUTPUT_MAX),
        "{err:?}"
    );
    // And metadata (its name goes into the WasmReconciler's status).
    let err = engine
        .load(
            &modules::bytes(modules::MISBEHAVE_HUGE_METADATA),
            &Limits::default(),
        )
        .expect_err("a 2 MiB name");
    assert!(
        matches!(&err, LoadError::Metadata(m) if m.contains("over the cap")),
        "{err}"
    );
    assert_good(&module);
}

/// Whether `text` could break a log line or drive a terminal when printed as is.
fn is_risky(text: &str) -> bool {
    text.chars()
        .any(|c| c.is_control() || ('\u{202a}'..='\u{202e}').contains(&c))
}

#[test]
fn what_a_module_prints_or_says_reaches_events_logs_and_users_inert() {
    let engine = engine();
    let module = load(&engine, modules::MISBEHAVE);
    for mode in ["forge-panic", "forge-error"] {
        let err = module
            .reconcile(widget(mode), &limits())
            .result
            .expect_err("must fail");
        let shown = err.to_string();
        assert!(
            matches!(err, CallError::Panic { .. } | CallError::Module { .. }),
            "{mode}: {err:?}"
        );
        assert!(!is_risky(&shown), "{mode} is shown as is: {shown:?}");
        assert!(shown.contains("forged\\n2026"), "{mode}: {shown:?}");
    }
    let verdict = module
        .validate(validate_request("forge"), &limits())
        .result
        .expect("a verdict");
    let wasmop::contract::ValidateResponse::Denied { message, field } = verdict else {
        panic!("the forge mode denies: {verdict:?}");
    };
    assert!(
        !is_risky(&message),
        "the denial is shown as is: {message:?}"
    );
    assert!(!is_risky(field.as_deref().unwrap_or_default()));
    assert!(message.starts_with("forged\\n"), "{message:?}");
    assert_good(&module);
}

/// A call's writes to linear memory, in its image and in pages it grew, are gone for the next
/// call: each call starts from the module's initial memory, whichever way the pool resets a
/// slot (on Linux 6.7+ only the pages the call wrote, through `PAGEMAP_SCAN`).
#[test]
fn a_call_sees_nothing_a_previous_call_wrote_to_memory() {
    let engine = engine();
    let module = load(&engine, modules::MISBEHAVE);
    let mut seen = Vec::new();
    for _ in 0..4 {
        let response = module
            .reconcile(widget("remember"), &limits())
            .result
            .expect("the remember widget reconciles");
        seen.push(response.children[0].objects[0]["data"].clone());
    }
    for data in &seen {
        assert_eq!(
            data["calls"], "7",
            "the counter starts from the image: {seen:?}"
        );
        assert_eq!(
            data["dirtyGrownBytes"], "0",
            "grown pages start zeroed: {seen:?}"
        );
        assert_eq!(
            data["grownAt"], seen[0]["grownAt"],
            "the same initial size: {seen:?}"
        );
    }
}

/// What the `entropy` mode read from the sandbox's clocks and randomness.
fn entropy(module: &Module, request: ReconcileRequest) -> serde_json::Value {
    let response = module
        .reconcile(request, &limits())
        .result
        .expect("the entropy widget reconciles");
    response.children[0].objects[0]["data"].clone()
}

#[test]
fn the_sandbox_clock_and_randomness_come_from_the_request() {
    let engine = engine();
    let module = load(&engine, modules::MISBEHAVE);
    let mut request = widget("entropy");
    request.context.now_unix_ms = 1_700_000_000_123;
    let first = entropy(&module, request.clone());
    let again = entropy(&module, request.clone());
    assert_eq!(
        first, again,
        "the same request, the same clock and randomness"
    );
    assert_eq!(
        first["wall"], "1700000000123000000",
        "the wall clock starts at the request's time"
    );
    // Another object (or another time) gets other randomness.
    let mut other = request.clone();
    other.primary = other.primary.replace(r#""uid":"u""#, r#""uid":"u2""#);
    assert_ne!(other.primary, request.primary);
    assert_ne!(entropy(&module, other)["hashed"], first["hashed"]);
    request.context.now_unix_ms += 1;
    assert_ne!(entropy(&module, request)["hashed"], first["hashed"]);
}
