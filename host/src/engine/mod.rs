//! The sandbox: the only code in wasmop that touches wasmtime.
//!
//! An [`Engine`] compiles modules (Cranelift, with an on-disk artifact cache) and runs them. A
//! [`Module`] is a checked, compiled, pre-linked component (`InstancePre` made once); every call
//! gets a fresh `Store` and instance from a pooling allocator, so no state survives between calls
//! and one reconcile cannot see another's data.
//!
//! # Guarantees
//! - A module gets no filesystem, network, environment or inherited stdio; only the
//!   `wasmop:reconciler/host` log import and inert WASI interfaces.
//! - Every call is bounded: a wall-clock deadline (epoch interruption), a linear-memory cap, an
//!   output-size cap and a log-line budget ([`Limits`]).
//! - Every failure of a module is a typed [`CallError`]; the host never panics or aborts because
//!   of a module, and the engine stays usable for other modules and calls afterwards.
//!
//! # Errors
//! [`LoadError`] when bytes are not a usable module (each variant says what to do),
//! [`CallError`] when a call fails.

mod cache;
mod convert;
mod error;
mod sandbox;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use wasmtime::component::{Component, HasSelf, Linker, types::ComponentItem};
use wasmtime::{Store, Trap};

pub use cache::ArtifactCache;
pub use error::{CallError, LoadError};

use crate::contract::{
    FinalizeResponse, ModuleMetadata, ReconcileRequest, ReconcileResponse, ValidateRequest,
    ValidateResponse, WIT_PACKAGE, WIT_VERSION,
};
use sandbox::{MemoryCapExceeded, State};

mod bindings {
    wasmtime::component::bindgen!({
        world: "module",
        path: "../wit",
    });
}

/// The export a module must have: `wasmop:reconciler/guest@0.1.0`.
fn guest_export() -> String {
    format!("{WIT_PACKAGE}/guest@{WIT_VERSION}")
}

/// The functions of the guest interface.
const GUEST_FUNCTIONS: [&str; 4] = ["metadata", "reconcile", "finalize", "validate"];

/// How the engine is set up (process-wide).
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Where compiled modules are cached (None: no disk cache).
    pub cache_dir: Option<PathBuf>,
    /// The largest memory any module may be given (the pool reserves this per slot).
    pub max_memory_bytes: u64,
    /// How many sandboxes may exist at once (the pool size).
    pub max_instances: u32,
    /// The epoch tick; deadlines are rounded up to it.
    pub tick: Duration,
    /// Bytes of each pooled linear memory reset with memset instead of being returned to the
    /// kernel between calls: faster instantiation at the price of resident memory per slot.
    pub memory_keep_resident: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            cache_dir: None,
            max_memory_bytes: 512 << 20,
            max_instances: 256,
            tick: Duration::from_millis(2),
            memory_keep_resident: 4 << 20,
        }
    }
}

/// Per-call limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Wall-clock deadline of one call.
    pub deadline: Duration,
    /// Linear-memory cap.
    pub memory_bytes: u64,
    /// Cap on the bytes of text in a response.
    pub output_bytes: usize,
    /// Log lines a call may write (more are dropped and counted).
    pub log_lines: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            deadline: Duration::from_secs(2),
            memory_bytes: 64 << 20,
            output_bytes: 4 << 20,
            log_lines: 1000,
        }
    }
}

/// What a call cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallStats {
    /// Creating the store and instance.
    pub instantiate: Duration,
    /// The call itself, including converting the output.
    pub call: Duration,
    /// The highest linear-memory size reached, in bytes.
    pub memory_peak: u64,
    /// Log lines dropped over the budget.
    pub logs_dropped: usize,
}

/// A call's result and its cost.
#[derive(Debug)]
pub struct Outcome<T> {
    /// The result.
    pub result: Result<T, CallError>,
    /// The cost.
    pub stats: CallStats,
}

struct Ticker {
    stop: Arc<AtomicBool>,
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The process-wide compiler and sandbox factory. Cheap to clone.
#[derive(Clone)]
pub struct Engine {
    inner: wasmtime::Engine,
    linker: Arc<Linker<State>>,
    cache: Option<ArtifactCache>,
    tick: Duration,
    _ticker: Arc<Ticker>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("cache", &self.cache)
            .field("tick", &self.tick)
            .finish()
    }
}

/// Where a module's compiled code came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compiled {
    /// Compiled now, with Cranelift.
    Fresh,
    /// Loaded from the disk cache.
    FromCache,
}

/// A loaded module: checked, compiled, pre-linked. Cheap to clone; share it between calls.
#[derive(Clone)]
pub struct Module {
    pre: bindings::ModulePre<State>,
    engine: Engine,
    name: Arc<str>,
    metadata: ModuleMetadata,
    sha256: String,
    size: usize,
    compiled: Compiled,
    load_time: Duration,
}

impl std::fmt::Debug for Module {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Module")
            .field("name", &self.name)
            .field("sha256", &self.sha256)
            .field("size", &self.size)
            .field("compiled", &self.compiled)
            .finish()
    }
}

/// The sha256 of `bytes`, in hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

impl Engine {
    /// Builds the engine and starts its epoch ticker thread.
    ///
    /// # Errors
    /// [`LoadError::Engine`] if wasmtime rejects the configuration (for example, the machine
    /// cannot reserve the pool's address space).
    pub fn new(config: &EngineConfig) -> Result<Self, LoadError> {
        let mut pool = wasmtime::PoolingAllocationConfig::new();
        let memory = usize::try_from(config.max_memory_bytes)
            .map_err(|e| LoadError::Engine(format!("max memory: {e}")))?;
        pool.total_component_instances(config.max_instances)
            .total_core_instances(config.max_instances * 4)
            .total_memories(config.max_instances * 2)
            .total_tables(config.max_instances * 4)
            .max_memory_size(memory)
            .max_core_instances_per_component(16)
            .linear_memory_keep_resident(config.memory_keep_resident)
            .table_keep_resident(64 << 10);
        let mut wc = wasmtime::Config::new();
        wc.epoch_interruption(true)
            .cranelift_opt_level(wasmtime::OptLevel::Speed)
            .allocation_strategy(wasmtime::InstanceAllocationStrategy::Pooling(pool))
            .memory_init_cow(true)
            .wasm_backtrace_max_frames(None)
            .parallel_compilation(true);
        let inner = wasmtime::Engine::new(&wc).map_err(|e| LoadError::Engine(format!("{e:#}")))?;
        let mut linker = Linker::<State>::new(&inner);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker)
            .map_err(|e| LoadError::Engine(format!("linking WASI: {e:#}")))?;
        bindings::wasmop::reconciler::host::add_to_linker::<State, HasSelf<State>>(
            &mut linker,
            |s| s,
        )
        .map_err(|e| LoadError::Engine(format!("linking the host interface: {e:#}")))?;
        let stop = Arc::new(AtomicBool::new(false));
        {
            let (engine, stop, tick) = (inner.weak(), stop.clone(), config.tick);
            std::thread::Builder::new()
                .name("wasmop-epoch".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(tick);
                        match engine.upgrade() {
                            Some(e) => e.increment_epoch(),
                            None => return,
                        }
                    }
                })
                .map_err(|e| LoadError::Engine(format!("starting the epoch thread: {e}")))?;
        }
        let cache = config
            .cache_dir
            .clone()
            .map(|dir| ArtifactCache::new(dir, &inner));
        Ok(Engine {
            inner,
            linker: Arc::new(linker),
            cache,
            tick: config.tick,
            _ticker: Arc::new(Ticker { stop }),
        })
    }

    /// The compiled-module cache, if any.
    pub fn cache(&self) -> Option<&ArtifactCache> {
        self.cache.as_ref()
    }

    /// Checks and compiles `bytes` (or loads them from the cache), links them, and calls
    /// `metadata()` under `limits`. CPU-heavy on a cache miss: call it off async threads.
    ///
    /// # Errors
    /// See [`LoadError`].
    pub fn load(&self, bytes: &[u8], limits: &Limits) -> Result<Module, LoadError> {
        let started = Instant::now();
        check_header(bytes)?;
        let sha256 = sha256_hex(bytes);
        let cached = self
            .cache
            .as_ref()
            .and_then(|c| c.get(&self.inner, &sha256));
        let (component, compiled) = match cached {
            Some(c) => (c, Compiled::FromCache),
            None => {
                let c = Component::new(&self.inner, bytes)
                    .map_err(|e| LoadError::Compile(format!("{e:#}")))?;
                check_world(&self.inner, &c)?;
                if let Some(cache) = &self.cache
                    && let Err(e) = cache.put(&sha256, &c)
                {
                    tracing::warn!(dir = %cache.dir().display(), error = %e, "cannot write the compiled-module cache; the next load compiles again");
                }
                (c, Compiled::Fresh)
            }
        };
        check_world(&self.inner, &component)?;
        let instance_pre = self
            .linker
            .instantiate_pre(&component)
            .map_err(|e| link_error(&e))?;
        let pre = bindings::ModulePre::new(instance_pre).map_err(|e| LoadError::TypeMismatch {
            detail: format!("{e:#}"),
            supported: WIT_VERSION,
        })?;
        let mut module = Module {
            pre,
            engine: self.clone(),
            name: Arc::from(format!("sha256:{}", &sha256[..12])),
            metadata: placeholder_metadata(),
            sha256,
            size: bytes.len(),
            compiled,
            load_time: Duration::ZERO,
        };
        let metadata = module
            .call(limits, |g, s| g.call_metadata(s).map(Ok))
            .result
            .map_err(|e| LoadError::Metadata(format!("failed: {e}")))?;
        let metadata = convert::metadata_out(metadata);
        check_metadata(&metadata)?;
        module.name = Arc::from(metadata.name.as_str());
        module.metadata = metadata;
        module.load_time = started.elapsed();
        Ok(module)
    }
}

fn placeholder_metadata() -> ModuleMetadata {
    ModuleMetadata {
        name: String::new(),
        version: String::new(),
        primary: crate::contract::Gvk::new("", ""),
        owns: Vec::new(),
        related: Vec::new(),
        finalizes: false,
        validates: false,
    }
}

fn check_header(bytes: &[u8]) -> Result<(), LoadError> {
    if bytes.len() < 8 || &bytes[..4] != b"\0asm" {
        return Err(LoadError::NotWasm {
            len: bytes.len(),
            head: bytes.iter().take(8).copied().collect(),
        });
    }
    // Core modules have version 1 (layer 0); components have layer 1.
    if bytes[4..8] == [1, 0, 0, 0] {
        return Err(LoadError::CoreModule);
    }
    Ok(())
}

/// Checks, by name, that the component exports the guest interface of our version and imports
/// nothing but the host interface and WASI, so a mismatch gets a precise message.
fn check_world(engine: &wasmtime::Engine, component: &Component) -> Result<(), LoadError> {
    let ty = component.component_type();
    let wanted = guest_export();
    let prefix = format!("{WIT_PACKAGE}/guest@");
    let exports: Vec<(String, ComponentItem)> = ty
        .exports(engine)
        .map(|(name, e)| (name.to_string(), e.ty))
        .collect();
    let names = || {
        exports
            .iter()
            .map(|(n, _)| n.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let Some((_, item)) = exports.iter().find(|(n, _)| *n == wanted) else {
        if let Some((other, _)) = exports.iter().find(|(n, _)| n.starts_with(&prefix)) {
            return Err(LoadError::VersionMismatch {
                found: other.clone(),
                supported: WIT_VERSION,
            });
        }
        return Err(LoadError::MissingExports {
            missing: format!("the interface {wanted}"),
            exports: names(),
            supported: WIT_VERSION,
        });
    };
    let ComponentItem::ComponentInstance(instance) = item else {
        return Err(LoadError::MissingExports {
            missing: format!("{wanted} as an interface instance"),
            exports: names(),
            supported: WIT_VERSION,
        });
    };
    let functions: Vec<String> = instance
        .exports(engine)
        .map(|(n, _)| n.to_string())
        .collect();
    let missing: Vec<&str> = GUEST_FUNCTIONS
        .iter()
        .copied()
        .filter(|f| !functions.iter().any(|n| n == f))
        .collect();
    if !missing.is_empty() {
        return Err(LoadError::MissingExports {
            missing: format!("{wanted}#{{{}}}", missing.join(", ")),
            exports: names(),
            supported: WIT_VERSION,
        });
    }
    let ours = [
        format!("{WIT_PACKAGE}/host@{WIT_VERSION}"),
        format!("{WIT_PACKAGE}/types@{WIT_VERSION}"),
    ];
    let host_prefix = format!("{WIT_PACKAGE}/");
    for (name, _) in ty.imports(engine) {
        if ours.iter().any(|o| o == name) || name.starts_with("wasi:") {
            continue;
        }
        if name.starts_with(&host_prefix) {
            return Err(LoadError::VersionMismatch {
                found: name.to_string(),
                supported: WIT_VERSION,
            });
        }
        return Err(LoadError::UnsupportedImport {
            import: name.to_string(),
        });
    }
    Ok(())
}

fn link_error(e: &wasmtime::Error) -> LoadError {
    let text = format!("{e:#}");
    if let Some(rest) = text.split("component imports instance `").nth(1) {
        let import = rest.split('`').next().unwrap_or(rest).to_string();
        if import.starts_with("wasi:") {
            return LoadError::TypeMismatch {
                detail: format!(
                    "it imports {import}, a WASI version this host does not link (modules must target WASI 0.2): {text}"
                ),
                supported: WIT_VERSION,
            };
        }
        return LoadError::UnsupportedImport { import };
    }
    LoadError::TypeMismatch {
        detail: text,
        supported: WIT_VERSION,
    }
}

fn check_metadata(m: &ModuleMetadata) -> Result<(), LoadError> {
    let bad = |what: String| Err(LoadError::Metadata(what));
    if m.name.trim().is_empty() {
        return bad("returned an empty module name".into());
    }
    if m.primary.api_version.is_empty() || m.primary.kind.is_empty() {
        return bad(format!(
            "declares no primary kind (got apiVersion {:?}, kind {:?}); set it with Metadata::primary",
            m.primary.api_version, m.primary.kind
        ));
    }
    for k in m.owns.iter().chain(m.related.iter().map(|r| &r.kind)) {
        if k.api_version.is_empty() || k.kind.is_empty() {
            return bad(format!(
                "declares an owned or related kind without apiVersion or kind: {k:?}"
            ));
        }
        if *k == m.primary {
            return bad(format!("declares its primary kind {k} as owned or related"));
        }
    }
    Ok(())
}

impl Module {
    /// What the module says about itself.
    pub fn metadata(&self) -> &ModuleMetadata {
        &self.metadata
    }

    /// The sha256 of the module's bytes, in hex.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    /// The size of the module's bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Whether the code was compiled now or loaded from the cache.
    pub fn compiled(&self) -> Compiled {
        self.compiled
    }

    /// How long [`Engine::load`] took.
    pub fn load_time(&self) -> Duration {
        self.load_time
    }

    /// The WIT package version the module implements.
    pub fn wit_version(&self) -> &'static str {
        WIT_VERSION
    }

    /// Runs `reconcile`.
    pub fn reconcile(
        &self,
        request: ReconcileRequest,
        limits: &Limits,
    ) -> Outcome<ReconcileResponse> {
        let request = convert::request_in(request);
        let out = self.call(limits, |g, s| g.call_reconcile(s, &request));
        flatten(out, limits, convert::response_size, convert::response_out)
    }

    /// Runs `finalize`.
    pub fn finalize(
        &self,
        request: ReconcileRequest,
        limits: &Limits,
    ) -> Outcome<FinalizeResponse> {
        let request = convert::request_in(request);
        let out = self.call(limits, |g, s| g.call_finalize(s, &request));
        flatten(out, limits, convert::finalize_size, convert::finalize_out)
    }

    /// Runs `validate`.
    pub fn validate(&self, request: ValidateRequest, limits: &Limits) -> Outcome<ValidateResponse> {
        let request = convert::validate_in(request);
        let Outcome { result, stats } =
            self.call(limits, |g, s| g.call_validate(s, &request).map(Ok));
        Outcome {
            result: result.map(convert::validate_out),
            stats,
        }
    }

    /// Instantiates a fresh sandbox and calls `f` in it, turning every failure into a
    /// [`CallError`]. `f` returns the module's own result (`Err` = the module's error).
    fn call<T>(
        &self,
        limits: &Limits,
        f: impl FnOnce(
            &bindings::exports::wasmop::reconciler::guest::Guest,
            &mut Store<State>,
        ) -> wasmtime::Result<
            Result<T, bindings::wasmop::reconciler::types::ReconcileError>,
        >,
    ) -> Outcome<T> {
        let started = Instant::now();
        let mut stats = CallStats::default();
        let engine = &self.engine;
        let mut store = Store::new(
            &engine.inner,
            State::new(self.name.clone(), limits.memory_bytes, limits.log_lines),
        );
        store.limiter(|s| &mut s.limiter);
        let tick_nanos = engine.tick.as_nanos().max(1);
        let ticks = limits.deadline.as_nanos().div_ceil(tick_nanos) + 1;
        store.set_epoch_deadline(u64::try_from(ticks).unwrap_or(u64::MAX));
        store.epoch_deadline_trap();
        let instance = match self.pre.instantiate(&mut store) {
            Ok(i) => i,
            Err(e) => {
                stats.instantiate = started.elapsed();
                let err = classify(&e, &store, limits, true);
                return Outcome {
                    result: Err(err),
                    stats,
                };
            }
        };
        stats.instantiate = started.elapsed();
        let called = Instant::now();
        let result = f(instance.wasmop_reconciler_guest(), &mut store);
        stats.call = called.elapsed();
        stats.memory_peak = store.data().limiter.peak;
        stats.logs_dropped = store.data().logs_dropped;
        if stats.logs_dropped > 0 {
            tracing::warn!(module = %self.name, dropped = stats.logs_dropped, "module log lines over the per-call budget were dropped");
        }
        let result = match result {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(CallError::Module { message: e.message }),
            Err(e) => Err(classify(&e, &store, limits, false)),
        };
        Outcome { result, stats }
    }
}

fn flatten<W, T>(
    out: Outcome<W>,
    limits: &Limits,
    size: impl FnOnce(&W) -> usize,
    convert: impl FnOnce(W) -> Result<T, CallError>,
) -> Outcome<T> {
    let Outcome { result, mut stats } = out;
    let started = Instant::now();
    let result = result.and_then(|w| {
        let n = size(&w);
        if n > limits.output_bytes {
            return Err(CallError::OutputTooLarge {
                size: n,
                limit: limits.output_bytes,
            });
        }
        convert(w)
    });
    stats.call += started.elapsed();
    Outcome { result, stats }
}

/// Turns a wasmtime error from instantiation or a call into a typed [`CallError`].
fn classify(
    e: &wasmtime::Error,
    store: &Store<State>,
    limits: &Limits,
    instantiating: bool,
) -> CallError {
    let state = store.data();
    let memory_denied = e
        .chain()
        .any(|c| c.downcast_ref::<MemoryCapExceeded>().is_some());
    if memory_denied || state.limiter.denied.is_some() {
        return CallError::Memory {
            requested: state.limiter.denied.unwrap_or_default(),
            limit: limits.memory_bytes,
        };
    }
    let stderr = state.stderr_tail(2048);
    match e.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => CallError::Deadline {
            deadline: limits.deadline,
        },
        Some(Trap::UnreachableCodeReached) if !stderr.is_empty() => CallError::Panic {
            message: panic_message(&stderr),
        },
        Some(trap) => CallError::Trap {
            trap: trap.to_string(),
            stderr,
        },
        None if instantiating => CallError::Sandbox {
            detail: format!("{e:#}"),
        },
        None => CallError::Trap {
            trap: format!("{e:#}"),
            stderr,
        },
    }
}

/// The useful part of a Rust panic report: the message after `panicked at file:line:col:`.
fn panic_message(stderr: &str) -> String {
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.starts_with("note: run with `RUST_BACKTRACE"))
        .collect();
    match lines.iter().position(|l| l.contains("panicked at")) {
        Some(i) => {
            let location = lines[i]
                .split("panicked at ")
                .nth(1)
                .unwrap_or_default()
                .trim_end_matches(':');
            let message = lines[i + 1..].join("\n");
            if message.is_empty() {
                lines[i].to_string()
            } else {
                format!("{message} (at {location})")
            }
        }
        None => lines.join("\n"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panic_messages_are_extracted_from_rust_panic_reports() {
        let report = "thread '<unnamed>' panicked at src/lib.rs:10:5:\nboom: 42\nnote: run with `RUST_BACKTRACE=1` environment variable to display a backtrace";
        assert_eq!(panic_message(report), "boom: 42 (at src/lib.rs:10:5)");
        assert_eq!(panic_message("abort: oops"), "abort: oops");
    }

    #[test]
    fn headers_are_checked_before_compiling() {
        assert!(matches!(
            check_header(b"hello world"),
            Err(LoadError::NotWasm { .. })
        ));
        assert!(matches!(
            check_header(b"\0asm\x01\0\0\0"),
            Err(LoadError::CoreModule)
        ));
        assert!(check_header(b"\0asm\x0d\0\x01\0").is_ok());
    }
}
