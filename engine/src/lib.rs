//! The sandbox: the low-level Wasm functionality the wasmop host needs, and the only crate of
//! wasmop that depends on wasmtime. Most of it wraps [`wasmtime`] to narrow its flexibility to
//! what wasmop uses (components of the `wasmop:reconciler` world, async exports driven off the
//! caller's runtime, a pooling allocator, Cranelift with Winch as the fast tier), so the
//! sandbox's boundary is visible in Cargo.toml. The host re-exports this crate as
//! `wasmop::engine` and its [`contract`] as `wasmop::contract`.
//!
//! An [`Engine`] compiles modules (Cranelift, with an on-disk artifact cache) and runs them. A
//! [`Module`] is a checked, compiled, pre-linked component (`InstancePre` made once); every call
//! gets a fresh `Store` and instance from a pooling allocator, so no state survives between calls
//! and one reconcile cannot see another's data.
//!
//! # Guarantees
//! - A module gets no filesystem, network, environment or inherited stdio; only the
//!   `wasmop:reconciler/host` log import and inert WASI interfaces.
//! - Every call is bounded: a wall-clock deadline, a linear-memory cap, an output-size cap and a
//!   log-line budget ([`Limits`]). The deadline holds whatever the guest does: a CPU loop is
//!   interrupted by the epoch deadline, and a guest blocked in a WASI call (a sleep, a clock
//!   subscription) is abandoned when the call's future is dropped at the deadline (wasmtime's
//!   async API under a timeout), which frees its store and pool slot at once.
//! - The output cap is enforced while the host copies the result out of the guest (wasmtime's
//!   hostcall fuel), so a guest cannot make the host copy much more than the cap (for example
//!   with strings that alias one buffer); `metadata` and `validate` output are capped too.
//! - Calls wait for a slot in one process-wide, fair queue ([`CallQueue`]) instead of failing
//!   when the sandbox pool is full; waiting counts against the call's deadline, and a call whose
//!   deadline passes while queued fails with [`CallError::Queued`], which is not the module's
//!   fault.
//! - Every failure of a module is a typed [`CallError`]; the host never panics or aborts because
//!   of a module, and the engine stays usable for other modules and calls afterwards.
//!
//! # Errors
//! [`LoadError`] when bytes are not a usable module (each variant says what to do),
//! [`CallError`] when a call fails.

mod cache;
mod charge;
mod compile;
pub mod contract;
mod convert;
mod determinism;
mod digested;
mod error;
pub mod hook;
mod needs;
mod quarantine;
mod queue;
mod sandbox;
pub mod text;
mod ticker;
mod tier;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, Weak};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use wasmtime::component::{Component, HasSelf, Linker, types::ComponentItem};
use wasmtime::{Store, Trap};

pub use cache::{ArtifactCache, DEFAULT_CACHE_MAX_BYTES};
pub use determinism::TICK as CLOCK_TICK;
pub use digested::{Digested, Hashing};
pub use error::{CallError, LoadError};
pub use hook::{HookAdapter, HookKind, HookRequest};
pub use needs::{Needs, NeedsError, needs};
pub use quarantine::{
    DEFAULT_QUARANTINE_AFTER, MAX_MARKERS as MAX_QUARANTINE_MARKERS, exiting as exiting_process,
};
pub use queue::{CallQueue, QueueTimeout, Slot};
pub use tier::{CompileGate, CompilePermit, FastCompiler, Tier};

use crate::contract::{
    FinalizeResponse, ModuleMetadata, ReconcileRequest, ReconcileResponse, ValidateRequest,
    ValidateResponse, WIT_PACKAGE, WIT_VERSION,
};
use charge::Charge;
use compile::Compiler;
use determinism::Entropy;
use sandbox::{MemoryCapExceeded, State};
use ticker::Ticker;

mod bindings {
    wasmtime::component::bindgen!({
        world: "module",
        path: "../wit",
        // Async exports: a call is a future that can be dropped at its deadline even while the
        // guest is blocked in a WASI call. The host's own import (`log`) stays synchronous.
        exports: { default: async },
    });
}

mod hook_bindings {
    wasmtime::component::bindgen!({
        world: "hook",
        path: "../wit",
        exports: { default: async },
        // The same `host` import as the module world: one linker serves both.
        with: { "wasmop:reconciler/host": super::bindings::wasmop::reconciler::host },
    });
}

/// A module's pre-linked build, by the world it implements.
#[derive(Clone)]
enum Pre {
    Module(bindings::ModulePre<State>),
    Hook(hook_bindings::HookPre<State>),
}

impl Pre {
    fn engine(&self) -> &wasmtime::Engine {
        match self {
            Pre::Module(p) => p.engine(),
            Pre::Hook(p) => p.engine(),
        }
    }

    fn instance_pre(&self) -> &wasmtime::component::InstancePre<State> {
        match self {
            Pre::Module(p) => p.instance_pre(),
            Pre::Hook(p) => p.instance_pre(),
        }
    }

    /// The typed exports of `instance`.
    fn exports(
        &self,
        store: &mut Store<State>,
        instance: &wasmtime::component::Instance,
    ) -> wasmtime::Result<Exports> {
        Ok(match self {
            Pre::Module(_) => Exports::Module(bindings::Module::new(store, instance)?),
            Pre::Hook(_) => Exports::Hook(hook_bindings::Hook::new(store, instance)?),
        })
    }
}

/// The exports of one sandbox.
enum Exports {
    Module(bindings::Module),
    Hook(hook_bindings::Hook),
}

impl Exports {
    /// The guest interface, or an error for a hook module (which has none).
    fn guest(&self) -> wasmtime::Result<&bindings::exports::wasmop::reconciler::guest::Guest> {
        match self {
            Exports::Module(m) => Ok(m.wasmop_reconciler_guest()),
            Exports::Hook(_) => Err(wasmtime::format_err!(
                "a hook module (world `hook`) has no guest interface: it serves only a Metacontroller controller"
            )),
        }
    }

    /// The hooks interface, or an error for a module of the `module` world.
    fn hooks(&self) -> wasmtime::Result<&hook_bindings::exports::wasmop::reconciler::hooks::Guest> {
        match self {
            Exports::Hook(h) => Ok(h.wasmop_reconciler_hooks()),
            Exports::Module(_) => Err(wasmtime::format_err!(
                "a module of the `module` world has no hooks interface"
            )),
        }
    }
}

/// The export a module must have: `wasmop:reconciler/guest@0.1.0`.
fn guest_export() -> String {
    format!("{WIT_PACKAGE}/guest@{WIT_VERSION}")
}

/// The most core-module instances one module may make. A Rust module makes 2 or 3; a Python
/// module built by componentize-py 0.25 makes 16 (CPython, its libc, WASI adapters, shims).
pub const MAX_CORE_INSTANCES_PER_MODULE: u32 = 32;

/// The functions of the guest interface.
const GUEST_FUNCTIONS: [&str; 4] = ["metadata", "reconcile", "finalize", "validate"];

/// The functions of the hooks interface.
const HOOK_FUNCTIONS: [&str; 1] = ["call"];

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
    /// How many module calls may run at once (the slots of the fair call queue; at most
    /// `max_instances`). More calls wait, within their deadline.
    pub max_calls: u32,
    /// How many unused sandbox slots keep their module's memory warm (wasmtime's
    /// `max_unused_warm_slots`; see [`default_warm_slots`]). A slot that ran a module keeps up to
    /// `memory_keep_resident` bytes resident for that module's next call; once this many unused
    /// slots are warm, a call of a module without a warm slot of its own takes the least
    /// recently used one instead of a never-used slot. Resident pool memory then follows the
    /// calls that run at once (at most this many plus the most calls that ever ran at once),
    /// not the number of modules loaded.
    pub warm_slots: u32,
    /// Tiered compilation: activate a quickly compiled build, optimize in the background
    /// (see [`Tier`]). Off (the default, for one-shot tools and tests): every load compiles
    /// optimized before it returns. The host (`wasmop run`) turns it on.
    pub tiered: bool,
    /// Optimized builds compiled in the background at once (each on one thread).
    pub max_background_compiles: usize,
    /// The most memory the running module calls may be capped at together: each call reserves
    /// its `Limits::memory_bytes` (at most this whole budget) while it runs, and waits in the
    /// call queue for room. Unbounded by default; the host sets it below its pod's memory limit.
    pub memory_budget_bytes: u64,
    /// Fresh compiles that loads run at once (the fast build, or the optimized one untiered);
    /// more wait. Loads of one module never compile it side by side: the second waits for the
    /// first and loads its cache entry.
    pub max_foreground_compiles: usize,
    /// The compiler of the fast tier.
    pub fast_compiler: FastCompiler,
    /// The size bound of the on-disk compiled cache (least recently used entries are evicted).
    pub cache_max_bytes: u64,
    /// Consecutive crashes of the host during compiles of one module after which it is refused
    /// ([`LoadError::Quarantined`]; 0: never). Needs `cache_dir`, where the markers are kept.
    pub quarantine_after: u32,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            cache_dir: None,
            max_memory_bytes: 512 << 20,
            max_instances: 256,
            tick: Duration::from_millis(2),
            memory_keep_resident: 4 << 20,
            max_calls: 256,
            warm_slots: default_warm_slots(),
            tiered: false,
            max_background_compiles: 1,
            max_foreground_compiles: 2,
            memory_budget_bytes: u64::MAX,
            fast_compiler: FastCompiler::default(),
            cache_max_bytes: DEFAULT_CACHE_MAX_BYTES,
            quarantine_after: quarantine::DEFAULT_QUARANTINE_AFTER,
        }
    }
}

/// The default [`EngineConfig::warm_slots`]: the CPUs this process may use (at least 1). A module
/// call runs on its caller's thread and does no I/O, so about this many run at once when calls
/// are many; each of them finds a warm slot. wasmtime's own default (100) kept a slot warm for
/// every module whose `metadata()` ran at load, ~5 MiB each for the image-updater example, so an
/// idle host's memory grew with the modules loaded (docs/benchmarks.md, "Idle host memory").
pub fn default_warm_slots() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| u32::try_from(n.get()).unwrap_or(u32::MAX))
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

/// The most bytes of text `metadata()` may return (name, version, kinds, selectors).
pub const METADATA_OUTPUT_MAX: usize = 64 << 10;
/// The most bytes of text `validate()` may return (warnings, or the denial's message and field),
/// whatever the output cap: the verdict goes into an AdmissionReview response.
pub const VALIDATE_OUTPUT_MAX: usize = 64 << 10;

/// The hostcall fuel for a call whose output is capped at `cap` bytes: the most bytes wasmtime
/// copies out of the guest in one transfer (a result, or the arguments of one host call). Twice
/// the cap plus 64 KiB leaves room for the lists' own structure (8 to 32 bytes per element)
/// while keeping what a guest can make the host copy within a small multiple of the cap.
pub fn hostcall_fuel(cap: usize) -> usize {
    cap.saturating_mul(2).saturating_add(64 << 10)
}

/// What a call cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallStats {
    /// Waiting in the call queue for a sandbox slot.
    pub queued: Duration,
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

/// The process-wide compiler and sandbox factory. Cheap to clone.
#[derive(Clone)]
pub struct Engine {
    inner: wasmtime::Engine,
    /// Compiles for `inner` in a throwaway engine (see [`Compiler`]).
    compiler: Compiler,
    linker: Arc<Linker<State>>,
    cache: Option<ArtifactCache>,
    /// The quick compiler of tiered compilation, if on.
    fast: Option<FastTier>,
    compiles: Arc<CompileGate>,
    /// The gate of loads' fresh compiles, and their flights by digest.
    foreground: Arc<CompileGate>,
    flights: Arc<Flights>,
    tick: Duration,
    queue: CallQueue,
    /// Advances the epoch while calls run (their deadlines).
    ticker: Arc<Ticker>,
}

/// Fresh compiles of loads under way, one per digest and tier at a time ([`build`]): a second
/// load of the same module waits for the first and then finds its cache entry, instead of
/// compiling it again beside it (a copy of the module and a compile's memory each).
#[derive(Debug, Default)]
struct Flights {
    held: Mutex<HashMap<String, Arc<Mutex<()>>>>,
}

impl Flights {
    /// The lock of `key`'s compile (flights no one holds are forgotten on the way).
    fn of(&self, key: String) -> Arc<Mutex<()>> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.retain(|_, flight| Arc::strong_count(flight) > 1);
        held.entry(key).or_default().clone()
    }
}

/// What a load's fresh compile waits for ([`build`]): the flight of its digest and tier, then a
/// permit of the foreground gate.
struct Foreground<'a> {
    flights: &'a Flights,
    gate: &'a Arc<CompileGate>,
    tier: &'static str,
}

/// The engine that compiles fast builds ([`FastCompiler`]); its sandboxes come
/// from the on-demand allocator, since a fast build serves only until the optimized one is in.
#[derive(Clone)]
struct FastTier {
    inner: wasmtime::Engine,
    compiler: Compiler,
    linker: Arc<Linker<State>>,
    cache: Option<ArtifactCache>,
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
    /// The build serving calls; tiered compilation replaces it with the optimized one.
    pre: Arc<RwLock<Pre>>,
    /// A hook module's adapter, once the host gave it one ([`Module::adapted`]).
    adapter: Option<Arc<dyn HookAdapter>>,
    tier: Arc<AtomicU8>,
    engine: Engine,
    name: Arc<str>,
    metadata: ModuleMetadata,
    sha256: String,
    size: usize,
    compiled: Compiled,
    load_time: Duration,
    needs: Needs,
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

/// Turns off the stack traces that Rust errors capture (`RUST_LIB_BACKTRACE=0`), unless the
/// environment sets `RUST_LIB_BACKTRACE` itself. wasmtime makes an error each time a sandbox's
/// store is dropped (once per call), and with `RUST_BACKTRACE=1` in the environment each one
/// walked the stack: ~7 us of a ~110 us call (`make bench-dispatch`), more on the host's deeper
/// stacks. Panics still print their backtraces as `RUST_BACKTRACE` says; no error wasmop logs
/// shows a captured stack.
///
/// # Safety
/// Changes the process environment: call it before any other thread starts (first thing in
/// `main`), as [`std::env::set_var`] requires.
#[allow(unsafe_code)]
pub unsafe fn skip_error_backtraces() {
    if std::env::var_os("RUST_LIB_BACKTRACE").is_none() {
        // SAFETY: the caller guarantees no other thread runs yet.
        unsafe { std::env::set_var("RUST_LIB_BACKTRACE", "0") };
    }
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
            // A Python module takes 14 core instances per sandbox, a Rust one 2 or 3.
            .total_core_instances(config.max_instances * 8)
            .total_memories(config.max_instances * 2)
            .total_tables(config.max_instances * 4)
            // Async calls run on fiber stacks: one per call.
            .total_stacks(config.max_instances)
            .max_memory_size(memory)
            .max_core_instances_per_component(MAX_CORE_INSTANCES_PER_MODULE)
            .linear_memory_keep_resident(config.memory_keep_resident)
            .max_unused_warm_slots(config.warm_slots)
            .table_keep_resident(64 << 10)
            // Linux 6.7+: a freed sandbox resets only the pages the call wrote (the kernel's
            // PAGEMAP_SCAN), not the whole keep-resident prefix of its memory; elsewhere
            // wasmtime resets the prefix as before.
            .pagemap_scan(wasmtime::Enabled::Auto);
        let mut wc = wasmtime::Config::new();
        wc.epoch_interruption(true)
            .cranelift_opt_level(wasmtime::OptLevel::Speed)
            .allocation_strategy(wasmtime::InstanceAllocationStrategy::Pooling(pool))
            .memory_init_cow(true)
            .wasm_backtrace_max_frames(None)
            // The map from native code to Wasm offsets serves only Wasm backtraces, which the
            // line above turns off. Without it, artifacts are 7-9% smaller, and the Python
            // example's fast build compiles ~4% faster with an 18 MiB lower peak
            // (`make bench-compile-settings`).
            .generate_address_map(false)
            // Tiered: optimized builds compile in the background, one thread each, so that
            // compiles leave cores to reconciles.
            .parallel_compilation(!config.tiered);
        let inner = wasmtime::Engine::new(&wc).map_err(|e| LoadError::Engine(format!("{e:#}")))?;
        let linker = new_linker(&inner)?;
        let fast = if config.tiered {
            let mut fc = wasmtime::Config::new();
            match config.fast_compiler {
                FastCompiler::CraneliftNone => fc.cranelift_opt_level(wasmtime::OptLevel::None),
                // Winch compiles function bodies; the trampolines (one per function that
                // escapes through a table or an export: thousands for CPython) are still
                // compiled by Cranelift, at this config's opt level. Unoptimized trampolines cut
                // the fast build of the Python example by 17-31% (docs/benchmarks.md).
                FastCompiler::Winch => fc
                    .strategy(wasmtime::Strategy::Winch)
                    .cranelift_opt_level(wasmtime::OptLevel::None),
            };
            fc.epoch_interruption(true)
                .memory_init_cow(true)
                .wasm_backtrace_max_frames(None)
                .generate_address_map(false)
                // `.eh_frame` serves only outside unwinders (`perf --call-graph dwarf`, gdb);
                // wasmtime walks guest frames by their frame pointers. The fast build serves
                // only until the optimized one replaces it, which keeps its unwind info. Without
                // it the Python example's fast build is 2% smaller and peaks 4-6 MiB lower
                // (`make bench-compile-settings`).
                .native_unwind_info(false)
                .parallel_compilation(true);
            let fast = wasmtime::Engine::new(&fc)
                .map_err(|e| LoadError::Engine(format!("the fast tier: {e:#}")))?;
            Some(FastTier {
                compiler: Compiler::new(&fc),
                linker: Arc::new(new_linker(&fast)?),
                cache: config.cache_dir.clone().map(|dir| {
                    ArtifactCache::new(dir, &fast, "fast", config.cache_max_bytes)
                        .with_quarantine_after(config.quarantine_after)
                }),
                inner: fast,
            })
        } else {
            None
        };
        let engines: Vec<_> = std::iter::once(&inner)
            .chain(fast.as_ref().map(|f| &f.inner))
            .map(wasmtime::Engine::weak)
            .collect();
        let ticker = Ticker::start(config.tick, move || {
            engines.iter().all(|engine| match engine.upgrade() {
                Some(e) => {
                    e.increment_epoch();
                    true
                }
                None => false,
            })
        })
        .map_err(|e| LoadError::Engine(format!("starting the epoch thread: {e}")))?;
        let cache = config.cache_dir.clone().map(|dir| {
            ArtifactCache::new(dir, &inner, "optimized", config.cache_max_bytes)
                .with_quarantine_after(config.quarantine_after)
        });
        Ok(Engine {
            inner,
            compiler: Compiler::new(&wc),
            linker: Arc::new(linker),
            cache,
            fast,
            compiles: CompileGate::new(config.max_background_compiles),
            foreground: CompileGate::new(config.max_foreground_compiles),
            flights: Arc::new(Flights::default()),
            tick: config.tick,
            queue: CallQueue::with_budget(
                config.max_calls.min(config.max_instances) as usize,
                config.memory_budget_bytes,
            ),
            ticker: Arc::new(ticker),
        })
    }

    /// What a load's fresh compile at `tier` waits for.
    fn foreground(&self, tier: &'static str) -> Foreground<'_> {
        Foreground {
            flights: &self.flights,
            gate: &self.foreground,
            tier,
        }
    }

    /// The compiled-module cache, if any.
    pub fn cache(&self) -> Option<&ArtifactCache> {
        self.cache.as_ref()
    }

    /// The process-wide queue every module call waits in for a sandbox slot.
    pub fn queue(&self) -> &CallQueue {
        &self.queue
    }

    /// Checks and compiles `bytes` (or loads them from the cache), links them, and calls
    /// `metadata()` under `limits`. CPU-heavy on a cache miss: call it off async threads.
    ///
    /// # Errors
    /// See [`LoadError`].
    pub fn load(&self, bytes: &[u8], limits: &Limits) -> Result<Module, LoadError> {
        self.load_hashed(bytes, None, sha256_hex(bytes), limits)
    }

    /// As [`Engine::load`], for bytes already hashed where they were read. The background
    /// compile of the optimized build shares `module`'s bytes (no copy).
    ///
    /// # Errors
    /// See [`LoadError`].
    pub fn load_digested(&self, module: &Digested, limits: &Limits) -> Result<Module, LoadError> {
        let (bytes, sha256) = (module.bytes(), module.sha256().to_string());
        self.load_hashed(bytes, Some(module.shared()), sha256, limits)
    }

    /// [`Engine::load`] of `bytes` whose sha256 is `sha256` (the callers make sure); `shared`,
    /// when given, holds the same bytes for the background compile, which copies them otherwise.
    fn load_hashed(
        &self,
        bytes: &[u8],
        shared: Option<Arc<Vec<u8>>>,
        sha256: String,
        limits: &Limits,
    ) -> Result<Module, LoadError> {
        let started = Instant::now();
        check_header(bytes)?;
        let needs = needs::needs(bytes).map_err(|e| LoadError::Compile(e.to_string()))?;
        check_needs(&needs, limits)?;
        if let Some(cache) = &self.cache {
            cache.check_quarantine(&sha256)?;
        }
        let optimized = self
            .cache
            .as_ref()
            .and_then(|c| c.get(&self.inner, &sha256));
        // Tiered: unless the optimized build is cached, serve a fast build first. A freshly
        // compiled fast build is written to the cache by the background thread, off the path
        // to the first call.
        let mut fresh_fast = None;
        let (pre, compiled, tier) = match (optimized, &self.fast) {
            (Some(component), _) => (
                link(&self.inner, &self.linker, &component)?,
                Compiled::FromCache,
                Tier::Optimized,
            ),
            (None, Some(fast)) => {
                let (pre, compiled, fresh) = build(
                    &fast.inner,
                    &fast.compiler,
                    &fast.linker,
                    fast.cache.as_ref(),
                    bytes,
                    &sha256,
                    CacheWrite::Later,
                    Some(self.foreground("fast")),
                )?;
                fresh_fast = fresh;
                (pre, compiled, Tier::Fast)
            }
            (None, None) => {
                // `CacheWrite::Now` caches the compile itself: nothing to `store`.
                let (pre, compiled, _) = build(
                    &self.inner,
                    &self.compiler,
                    &self.linker,
                    self.cache.as_ref(),
                    bytes,
                    &sha256,
                    CacheWrite::Now,
                    Some(self.foreground("optimized")),
                )?;
                (pre, compiled, Tier::Optimized)
            }
        };
        let is_hook = matches!(pre, Pre::Hook(_));
        let mut module = Module {
            pre: Arc::new(RwLock::new(pre)),
            adapter: None,
            tier: Arc::new(AtomicU8::new(tier as u8)),
            engine: self.clone(),
            name: Arc::from(text::short_sha(&sha256)),
            metadata: placeholder_metadata(),
            sha256,
            size: bytes.len(),
            compiled,
            load_time: Duration::ZERO,
            needs,
        };
        if is_hook {
            // A hook says nothing about itself: its metadata comes with its adapter.
            module.name = Arc::from(format!("hook-{}", text::short_sha(&module.sha256)).as_str());
            module.metadata.name = module.name.to_string();
            module.load_time = started.elapsed();
            if tier == Tier::Fast {
                let bytes = shared.unwrap_or_else(|| Arc::new(bytes.to_vec()));
                self.optimize_in_background(&module, bytes, fresh_fast);
            }
            return Ok(module);
        }
        let metadata = blocking(module.call(
            "load",
            limits,
            METADATA_OUTPUT_MAX,
            Entropy::FIXED,
            |g, s| Box::pin(async move { g.guest()?.call_metadata(s).await.map(Ok) }),
        ))
        .result
        .map_err(|e| match e {
            CallError::Interface { detail } => LoadError::TypeMismatch {
                detail,
                supported: WIT_VERSION,
            },
            e if e.is_module_fault() => LoadError::Metadata(format!("failed: {e}")),
            e => LoadError::Busy(e),
        })?;
        let metadata = convert::metadata_out(metadata);
        check_metadata_size(&metadata)?;
        check_metadata(&metadata)?;
        module.name = Arc::from(metadata.name.as_str());
        module.metadata = metadata;
        module.load_time = started.elapsed();
        if tier == Tier::Fast {
            let bytes = shared.unwrap_or_else(|| Arc::new(bytes.to_vec()));
            self.optimize_in_background(&module, bytes, fresh_fast);
        }
        Ok(module)
    }

    /// On a background thread: caches `fast` (the fast build just compiled, if any) and serves
    /// it from there ([`serve_from_cache`]), then compiles the optimized build of `module` (one
    /// compile permit) and swaps it in. The compile is skipped when nobody holds the module any
    /// more.
    fn optimize_in_background(
        &self,
        module: &Module,
        bytes: Arc<Vec<u8>>,
        fast: Option<Component>,
    ) {
        let engine = self.clone();
        let (pre, tier) = (Arc::downgrade(&module.pre), module.tier.clone());
        let (name, sha256) = (module.name.clone(), module.sha256.clone());
        let spawned = std::thread::Builder::new()
            .name("wasmop-optimize".into())
            .spawn(move || {
                if let (Some(fast_tier), Some(fast)) = (&engine.fast, fast) {
                    serve_from_cache(fast_tier, &pre, &sha256, fast);
                }
                let _permit = engine.compiles.acquire();
                if pre.strong_count() == 0 {
                    return;
                }
                let started = Instant::now();
                match build(
                    &engine.inner,
                    &engine.compiler,
                    &engine.linker,
                    engine.cache.as_ref(),
                    &bytes,
                    &sha256,
                    CacheWrite::Now,
                    None,
                ) {
                    Ok((optimized, _, _)) => {
                        let Some(pre) = pre.upgrade() else { return };
                        *pre.write().unwrap_or_else(PoisonError::into_inner) = optimized;
                        tier.store(Tier::Optimized as u8, Ordering::Release);
                        tracing::info!(target: "wasmop::engine", module = %name, sha256 = %sha256, took_ms = started.elapsed().as_millis() as u64, "the optimized build now serves");
                    }
                    Err(e) => {
                        tracing::warn!(target: "wasmop::engine", module = %name, sha256 = %sha256, error = %e, "the optimized build failed; the fast build keeps serving")
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(target: "wasmop::engine", module = %module.name, error = %e, "cannot start the optimizing compile; the fast build keeps serving");
        }
    }
}

/// Writes `fast`, the fast build just compiled (held in anonymous memory, a copy of the whole
/// artifact), to the fast tier's cache, and serves the cached entry instead, mapped from its file:
/// only the pages calls touch are resident, and the kernel can drop them. Until the optimized build
/// replaces it the fast build serves for a background compile's wait: with 20 modules loaded at
/// once and one compile permit, the last waits for 19 optimizing compiles, and each fast build of
/// the image-updater example held 3.8 MB. Nothing changes when the cache cannot be written or
/// read (the next load compiles again, as before), or when nobody holds the module any more.
fn serve_from_cache(fast_tier: &FastTier, pre: &Weak<RwLock<Pre>>, sha256: &str, fast: Component) {
    let Some(cache) = &fast_tier.cache else {
        return;
    };
    store(Some(cache), sha256, Some(&fast));
    drop(fast);
    let Some(pre) = pre.upgrade() else { return };
    let Some(mapped) = cache.get(&fast_tier.inner, sha256) else {
        return;
    };
    match link(&fast_tier.inner, &fast_tier.linker, &mapped) {
        Ok(mapped) => *pre.write().unwrap_or_else(PoisonError::into_inner) = mapped,
        Err(e) => {
            tracing::warn!(target: "wasmop::engine", sha256 = %sha256, error = %e, "the cached fast build does not link; the compiled one keeps serving")
        }
    }
}

/// When [`build`] writes a fresh compile to the compiled cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CacheWrite {
    /// Before using it: the artifact is written, then mapped from the cache file (the optimized
    /// build, which serves for the module's life: file-backed code, see [`ArtifactCache`]).
    Now,
    /// Later, by the caller with [`store`] (the fast build, which serves for seconds: written
    /// off the path to the first call).
    Later,
}

/// Loads `bytes` compiled for `engine` from `cache`, or compiles them with `compiler` (a throwaway
/// engine, so the compile's memory is freed); checks the world and
/// links. With [`CacheWrite::Later`], a freshly compiled component is returned too, for
/// [`store`]. With `foreground` (a load), a compile waits for another load's compile of the
/// same digest and tier (then looks in the cache again), and for a permit of the gate.
#[allow(clippy::too_many_arguments)]
fn build(
    engine: &wasmtime::Engine,
    compiler: &Compiler,
    linker: &Linker<State>,
    cache: Option<&ArtifactCache>,
    bytes: &[u8],
    sha256: &str,
    write: CacheWrite,
    foreground: Option<Foreground<'_>>,
) -> Result<(Pre, Compiled, Option<Component>), LoadError> {
    let cached = || cache.and_then(|c| c.get(engine, sha256));
    if let Some(component) = cached() {
        return Ok((link(engine, linker, &component)?, Compiled::FromCache, None));
    }
    let flight = foreground
        .as_ref()
        .map(|f| f.flights.of(format!("{}/{sha256}", f.tier)));
    let _one = flight
        .as_ref()
        .map(|f| f.lock().unwrap_or_else(PoisonError::into_inner));
    if flight.is_some()
        && let Some(component) = cached()
    {
        return Ok((link(engine, linker, &component)?, Compiled::FromCache, None));
    }
    let _permit = foreground.as_ref().map(|f| f.gate.acquire());
    // A crash from here on leaves the marker behind: counted towards quarantine at the next start.
    let _compiling = cache.map(|c| c.compiling(sha256));
    tracing::info!(target: "wasmop::engine", sha256 = %sha256, "compiling a module");
    if let (CacheWrite::Now, Some(cache)) = (write, cache) {
        let component = compiler.compile_into_cache(engine, bytes, cache, sha256)?;
        // A component of another world does not stay cached.
        let pre = link(engine, linker, &component).inspect_err(|_| cache.remove(sha256))?;
        return Ok((pre, Compiled::Fresh, None));
    }
    let component = compiler.compile(engine, bytes)?;
    // `link` checks the world first: a component of another world is never cached.
    let pre = link(engine, linker, &component)?;
    Ok((pre, Compiled::Fresh, Some(component)))
}

/// Writes `component` (when there is one) to `cache` (when there is one); a failure is logged,
/// never returned: the next load compiles again.
fn store(cache: Option<&ArtifactCache>, sha256: &str, component: Option<&Component>) {
    if let (Some(cache), Some(component)) = (cache, component)
        && let Err(e) = cache.put(sha256, component)
    {
        tracing::warn!(target: "wasmop::engine", dir = %cache.dir().display(), error = %e, "cannot write the compiled-module cache; the next load compiles again");
    }
}

/// Checks the world of a compiled `component` and pre-links it.
fn link(
    engine: &wasmtime::Engine,
    linker: &Linker<State>,
    component: &Component,
) -> Result<Pre, LoadError> {
    let world = check_world(engine, component)?;
    let instance_pre = linker
        .instantiate_pre(component)
        .map_err(|e| link_error(&e))?;
    let mismatch = |e: wasmtime::Error| LoadError::TypeMismatch {
        detail: format!("{e:#}"),
        supported: WIT_VERSION,
    };
    match world {
        World::Module => bindings::ModulePre::new(instance_pre)
            .map(Pre::Module)
            .map_err(mismatch),
        World::Hook => hook_bindings::HookPre::new(instance_pre)
            .map(Pre::Hook)
            .map_err(mismatch),
    }
}

/// The world a component implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum World {
    /// `module`: a reconciler.
    Module,
    /// `hook`: a Metacontroller hook.
    Hook,
}

/// The export a hook module must have: `wasmop:reconciler/hooks@0.1.0`.
fn hooks_export() -> String {
    format!("{WIT_PACKAGE}/hooks@{WIT_VERSION}")
}

/// The linker of `engine`: WASI (granting nothing) and the host interface.
fn new_linker(engine: &wasmtime::Engine) -> Result<Linker<State>, LoadError> {
    let mut linker = Linker::<State>::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)
        .map_err(|e| LoadError::Engine(format!("linking WASI: {e:#}")))?;
    bindings::wasmop::reconciler::host::add_to_linker::<State, HasSelf<State>>(&mut linker, |s| s)
        .map_err(|e| LoadError::Engine(format!("linking the host interface: {e:#}")))?;
    Ok(linker)
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

/// Refuses a module that could never be instantiated under this engine's pool or `limits`.
fn check_needs(needs: &Needs, limits: &Limits) -> Result<(), LoadError> {
    if needs.core_instances > MAX_CORE_INSTANCES_PER_MODULE {
        return Err(LoadError::Needs {
            what: "core-module instances",
            needs: u64::from(needs.core_instances),
            allowed: u64::from(MAX_CORE_INSTANCES_PER_MODULE),
            advice: "a module this large cannot run in a wasmop sandbox; split it or build it with fewer components",
        });
    }
    if needs.largest_initial_memory_bytes > limits.memory_bytes {
        return Err(LoadError::Needs {
            what: "bytes of initial linear memory",
            needs: needs.largest_initial_memory_bytes,
            allowed: limits.memory_bytes,
            advice: "raise spec.limits.memory of the WasmReconciler (wasmop test: --memory-mib)",
        });
    }
    Ok(())
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
fn check_world(engine: &wasmtime::Engine, component: &Component) -> Result<World, LoadError> {
    let ty = component.component_type();
    let is_hook = ty.exports(engine).any(|(name, _)| name == hooks_export());
    let (world, wanted, functions_wanted): (World, String, &[&str]) = if is_hook {
        (World::Hook, hooks_export(), &HOOK_FUNCTIONS)
    } else {
        (World::Module, guest_export(), &GUEST_FUNCTIONS)
    };
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
    let missing: Vec<&str> = functions_wanted
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
    Ok(world)
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

fn check_metadata_size(m: &ModuleMetadata) -> Result<(), LoadError> {
    let size = serde_json::to_vec(m).map_or(usize::MAX, |v| v.len());
    if size > METADATA_OUTPUT_MAX {
        return Err(LoadError::Metadata(format!(
            "returned {size} bytes, over the cap of {METADATA_OUTPUT_MAX} bytes (names, versions and kinds must be short)"
        )));
    }
    Ok(())
}

fn check_metadata(m: &ModuleMetadata) -> Result<(), LoadError> {
    let bad = |what: String| Err(LoadError::Metadata(what));
    if m.name.trim().is_empty() {
        return bad("returned an empty module name".into());
    }
    // The name and version reach log lines as they are: nothing that could forge one.
    for (what, text) in [("name", &m.name), ("version", &m.version)] {
        if text.chars().any(crate::text::is_unsafe_char) {
            return bad(format!(
                "returned a module {what} with control or bidirectional characters ({})",
                crate::text::cut(crate::text::inert(text).into_owned(), 256)
            ));
        }
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

    /// The build serving calls now: fast until tiered compilation swaps the optimized one in.
    pub fn tier(&self) -> Tier {
        if self.tier.load(Ordering::Acquire) == Tier::Fast as u8 {
            Tier::Fast
        } else {
            Tier::Optimized
        }
    }

    /// What one sandbox of this module takes from the pool (read from its bytes at load).
    pub fn needs(&self) -> &Needs {
        &self.needs
    }

    /// How long [`Engine::load`] took.
    pub fn load_time(&self) -> Duration {
        self.load_time
    }

    /// The WIT package version the module implements.
    pub fn wit_version(&self) -> &'static str {
        WIT_VERSION
    }

    /// Runs `reconcile`. The call queues in the lane of `request.context.reconciler`.
    ///
    /// # Panics
    /// If called on an async runtime's worker thread (the call blocks its thread): call it from
    /// `tokio::task::spawn_blocking` or a plain thread, or await [`Module::reconcile_async`].
    pub fn reconcile(
        &self,
        request: ReconcileRequest,
        limits: &Limits,
    ) -> Outcome<ReconcileResponse> {
        if let Some(adapter) = &self.adapter {
            return adapter.reconcile(self, request, limits);
        }
        blocking(self.reconcile_guest(request, limits))
    }

    /// Runs `reconcile` as [`Module::reconcile`] does, as an async task: the guest runs on the
    /// task's own thread and yields to the runtime every epoch tick, so no thread is handed the
    /// call and none blocks. A hook module's adapter (synchronous) still runs on a blocking
    /// thread.
    ///
    /// # Panics
    /// Outside a Tokio runtime with timers.
    pub async fn reconcile_async(
        &self,
        request: ReconcileRequest,
        limits: &Limits,
    ) -> Outcome<ReconcileResponse> {
        match &self.adapter {
            Some(adapter) => {
                let adapter = adapter.clone();
                off_the_workers(self, limits, move |m, l| adapter.reconcile(m, request, l)).await
            }
            None => self.reconcile_guest(request, limits).await,
        }
    }

    async fn reconcile_guest(
        &self,
        request: ReconcileRequest,
        limits: &Limits,
    ) -> Outcome<ReconcileResponse> {
        let entropy = Entropy::of_reconcile(&request);
        let request = convert::request_in(request);
        let lane = request.context.reconciler.clone();
        let out = self
            .call(&lane, limits, limits.output_bytes, entropy, move |g, s| {
                Box::pin(async move { g.guest()?.call_reconcile(s, &request).await })
            })
            .await;
        flatten(
            out,
            limits.output_bytes,
            convert::response_size,
            convert::response_out,
        )
    }

    /// Runs `finalize`. Queues and blocks like [`Module::reconcile`].
    ///
    /// # Panics
    /// As [`Module::reconcile`].
    pub fn finalize(
        &self,
        request: ReconcileRequest,
        limits: &Limits,
    ) -> Outcome<FinalizeResponse> {
        if let Some(adapter) = &self.adapter {
            return adapter.finalize(self, request, limits);
        }
        blocking(self.finalize_guest(request, limits))
    }

    /// Runs `finalize` as an async task, as [`Module::reconcile_async`] runs `reconcile`.
    ///
    /// # Panics
    /// As [`Module::reconcile_async`].
    pub async fn finalize_async(
        &self,
        request: ReconcileRequest,
        limits: &Limits,
    ) -> Outcome<FinalizeResponse> {
        match &self.adapter {
            Some(adapter) => {
                let adapter = adapter.clone();
                off_the_workers(self, limits, move |m, l| adapter.finalize(m, request, l)).await
            }
            None => self.finalize_guest(request, limits).await,
        }
    }

    async fn finalize_guest(
        &self,
        request: ReconcileRequest,
        limits: &Limits,
    ) -> Outcome<FinalizeResponse> {
        let entropy = Entropy::of_reconcile(&request);
        let request = convert::request_in(request);
        let lane = request.context.reconciler.clone();
        let out = self
            .call(&lane, limits, limits.output_bytes, entropy, move |g, s| {
                Box::pin(async move { g.guest()?.call_finalize(s, &request).await })
            })
            .await;
        flatten(
            out,
            limits.output_bytes,
            convert::finalize_size,
            convert::finalize_out,
        )
    }

    /// Runs `validate`; its output is capped at [`VALIDATE_OUTPUT_MAX`] (or the output cap if
    /// smaller). The call queues in the lane `validate/<module name>`.
    ///
    /// # Panics
    /// As [`Module::reconcile`].
    pub fn validate(&self, request: ValidateRequest, limits: &Limits) -> Outcome<ValidateResponse> {
        blocking(self.validate_async(request, limits))
    }

    /// Runs `validate` as an async task, as [`Module::reconcile_async`] runs `reconcile`.
    ///
    /// # Panics
    /// As [`Module::reconcile_async`].
    pub async fn validate_async(
        &self,
        request: ValidateRequest,
        limits: &Limits,
    ) -> Outcome<ValidateResponse> {
        let entropy = Entropy::of_validate(&request);
        let request = convert::validate_in(request);
        let cap = limits.output_bytes.min(VALIDATE_OUTPUT_MAX);
        let lane = format!("validate/{}", self.name);
        let out = self
            .call(&lane, limits, cap, entropy, move |g, s| {
                Box::pin(async move { g.guest()?.call_validate(s, &request).await.map(Ok) })
            })
            .await;
        flatten(out, cap, convert::validate_size, |v| {
            Ok(convert::validate_out(v))
        })
    }

    /// Whether the module implements the `hook` world (a Metacontroller hook).
    pub fn is_hook(&self) -> bool {
        matches!(
            *self.pre.read().unwrap_or_else(PoisonError::into_inner),
            Pre::Hook(_)
        )
    }

    /// Whether the module serves a primary with these `labels` and `annotations`: a hook
    /// module's controller may select its parents (see [`HookAdapter::selects`]); every other
    /// module serves every primary.
    pub fn selects(
        &self,
        labels: &std::collections::BTreeMap<String, String>,
        annotations: &std::collections::BTreeMap<String, String>,
    ) -> bool {
        self.adapter
            .as_ref()
            .is_none_or(|a| a.selects(labels, annotations))
    }

    /// This hook module, serving `reconcile` and `finalize` through `adapter`, described by
    /// `metadata` (which comes from the controller that names the hook).
    ///
    /// # Errors
    /// [`LoadError::Metadata`] if the module is not a hook module or `metadata` is not valid.
    pub fn adapted(
        mut self,
        metadata: ModuleMetadata,
        adapter: Arc<dyn HookAdapter>,
    ) -> Result<Module, LoadError> {
        if !self.is_hook() {
            return Err(LoadError::Metadata(
                "implements the `module` world, not the `hook` world a Metacontroller controller names: build the hook with `scripts/js-module.sh hook` or `scripts/python-module.sh hook`".into(),
            ));
        }
        check_metadata(&metadata)?;
        self.metadata = metadata;
        self.adapter = Some(adapter);
        Ok(self)
    }

    /// Runs one hook call of a hook module, in a fresh sandbox under `limits`, queued in
    /// `lane`. Its answer is capped at `limits.output_bytes`; a non-2xx answer is the
    /// module's error ([`CallError::Module`], with the status and what the hook said).
    ///
    /// # Panics
    /// As [`Module::reconcile`].
    pub fn hook(&self, request: HookRequest, lane: &str, limits: &Limits) -> Outcome<String> {
        use hook_bindings::exports::wasmop::reconciler::hooks as wit;
        let entropy = Entropy::of_hook(request.now_unix_ms, &request.body);
        let call = wit::HookRequest {
            kind: match request.kind {
                HookKind::Sync => wit::HookKind::Sync,
                HookKind::Finalize => wit::HookKind::Finalize,
                HookKind::Customize => wit::HookKind::Customize,
            },
            path: request.path,
            body: request.body,
        };
        let cap = limits.output_bytes;
        let out = blocking(self.call(lane, limits, cap, entropy, move |g, s| {
            Box::pin(async move {
                let answer = g.hooks()?.call_call(s, &call).await?;
                Ok(
                    answer.map_err(|e| bindings::wasmop::reconciler::types::ReconcileError {
                        message: format!("the hook answered HTTP {}: {}", e.status, e.message),
                    }),
                )
            })
        }));
        flatten(out, cap, String::len, Ok)
    }

    /// Waits for a slot in the call queue (lane `lane`), instantiates a fresh sandbox and calls
    /// `f` in it, all within the deadline, turning every failure into a [`CallError`]. `f`
    /// returns the module's own result (`Err` = the module's error). `output_cap` sets the
    /// hostcall fuel; `entropy` the sandbox's clocks and randomness.
    ///
    /// The guest runs on the thread that polls the returned future, and yields at its epoch
    /// ticks (see [`Module::store`]): awaited on an async worker, its code gives the worker back
    /// each tick (the engine's own steps between, instantiation and the conversions, do not
    /// yield), its waits for the worker not charged to its deadline ([`Charge`]); driven by
    /// [`blocking`], it blocks its caller's thread.
    async fn call<T: Send>(
        &self,
        lane: &str,
        limits: &Limits,
        output_cap: usize,
        entropy: Entropy,
        f: impl for<'a> FnOnce(&'a Exports, &'a mut Store<State>) -> GuestCall<'a, T> + Send,
    ) -> Outcome<T> {
        let started = Instant::now();
        let deadline_at = started + limits.deadline;
        let charge = Charge::new(started, limits.deadline, self.engine.tick);
        let mut stats = CallStats::default();
        let engine = &self.engine;
        let slot = engine
            .queue
            .acquire_async(lane, deadline_at, limits.memory_bytes)
            .await;
        stats.queued = started.elapsed();
        // `_slot` holds the queue's slot until the call returns.
        let _slot = match slot {
            Ok(slot) => slot,
            Err(e) => {
                let result = Err(CallError::Queued {
                    deadline: limits.deadline,
                    slots: e.slots,
                });
                return Outcome { result, stats };
            }
        };
        // The build current now serves this whole call, even if the optimized one lands.
        let pre = self
            .pre
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        // Declared before the store: the epoch advances until the store is gone.
        let _ticking = self.engine.ticker.running();
        let mut store = self.store(pre.engine(), limits, output_cap, entropy, &charge);
        let instantiating = Instant::now();
        let mut instantiated = None;
        let run = async {
            let instance = pre
                .instance_pre()
                .instantiate_async(&mut store)
                .await
                .map_err(|e| (e, Stage::Instantiate))?;
            // Type-checks the exports: names were checked at load, types only show here.
            let exports = pre
                .exports(&mut store, &instance)
                .map_err(|e| (e, Stage::Exports))?;
            instantiated = Some(Instant::now());
            f(&exports, &mut store).await.map_err(|e| (e, Stage::Call))
        };
        // Dropping `run` at the deadline abandons the guest wherever it is (in a WASI sleep,
        // too) and frees its instance.
        let result = charge.within(run).await;
        let done = Instant::now();
        match instantiated {
            Some(at) => {
                stats.instantiate = at - instantiating;
                stats.call = done - at;
            }
            None => stats.instantiate = done - instantiating,
        }
        stats.memory_peak = store.data().limiter.peak;
        stats.logs_dropped = store.data().logs_dropped;
        if stats.logs_dropped > 0 {
            tracing::warn!(target: "wasmop::engine", module = %self.name, dropped = stats.logs_dropped, "module log lines over the per-call budget were dropped");
        }
        let result = settle(result, &store, limits, output_cap);
        Outcome { result, stats }
    }

    /// A fresh store for one call: the memory cap and log budget, clocks and randomness from
    /// `entropy`, hostcall fuel for `output_cap`, and an epoch deadline that traps when
    /// `charge` is due. Until then the guest yields to the async runtime at its epoch ticks.
    fn store(
        &self,
        engine: &wasmtime::Engine,
        limits: &Limits,
        output_cap: usize,
        entropy: Entropy,
        charge: &Arc<Charge>,
    ) -> Store<State> {
        let state = State::new(
            self.name.clone(),
            limits.memory_bytes,
            limits.log_lines,
            &entropy,
        );
        let mut store = Store::new(engine, state);
        store.limiter(|s| &mut s.limiter);
        store.set_hostcall_fuel(hostcall_fuel(output_cap));
        store.set_epoch_deadline(1);
        let charge = Arc::clone(charge);
        store.epoch_deadline_callback(move |_| Ok(charge.at_tick(Instant::now())));
        store
    }
}

/// Where a wasmtime error of a call came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Making the sandbox: a failure is the host's (the pool is full, the system refused
    /// memory), unless the module's start function trapped.
    Instantiate,
    /// Type-checking the module's exports against the contract (their names were checked at
    /// load): a failure is the module's.
    Exports,
    /// The call itself.
    Call,
}

/// What a guest call ran to: the module's own result, or a wasmtime error and where it came
/// from.
type Ran<T> = Result<
    Result<T, bindings::wasmop::reconciler::types::ReconcileError>,
    (wasmtime::Error, Stage),
>;

/// A call's result as the host sees it: past the deadline, the module's value or its error
/// (made inert), or a failure classified ([`classify`]).
fn settle<T>(
    ran: Result<Ran<T>, tokio::time::error::Elapsed>,
    store: &Store<State>,
    limits: &Limits,
    output_cap: usize,
) -> Result<T, CallError> {
    match ran {
        Err(_elapsed) => Err(CallError::Deadline {
            deadline: limits.deadline,
        }),
        Ok(Ok(Ok(v))) => Ok(v),
        Ok(Ok(Err(e))) => Err(CallError::Module {
            message: text::inert(&e.message).into_owned(),
        }),
        Ok(Err((e, stage))) => Err(classify(&e, store, limits, output_cap, stage)),
    }
}

/// A guest call's future, borrowing the call's exports and store.
type GuestCall<'a, T> = std::pin::Pin<
    Box<
        dyn std::future::Future<
                Output = wasmtime::Result<
                    Result<T, bindings::wasmop::reconciler::types::ReconcileError>,
                >,
            > + Send
            + 'a,
    >,
>;

/// Drives a call on this thread, blocking it ([`Module::reconcile`] and the other synchronous
/// calls).
///
/// # Panics
/// On an async runtime's worker thread (Tokio refuses to block one).
fn blocking<T>(call: impl std::future::Future<Output = Outcome<T>>) -> Outcome<T> {
    match driver() {
        Ok(driver) => driver.block_on(call),
        Err(e) => Outcome {
            result: Err(e),
            stats: CallStats::default(),
        },
    }
}

/// Runs `f` (a hook adapter's synchronous calls) on a blocking thread of the current runtime.
async fn off_the_workers<T: Send + 'static>(
    module: &Module,
    limits: &Limits,
    f: impl FnOnce(&Module, &Limits) -> Outcome<T> + Send + 'static,
) -> Outcome<T> {
    let (module, limits) = (module.clone(), *limits);
    tokio::task::spawn_blocking(move || f(&module, &limits))
        .await
        .unwrap_or_else(|e| Outcome {
            result: Err(CallError::Sandbox {
                detail: format!("the hook adapter's thread did not complete: {e}"),
            }),
            stats: CallStats::default(),
        })
}

/// The runtime that drives the synchronous calls ([`blocking`]): the guest runs on the caller's
/// thread (`block_on`); the runtime's one worker thread only drives timers (guests' WASI sleeps
/// and clock subscriptions, call deadlines). Process-wide and never dropped.
fn driver() -> Result<&'static tokio::runtime::Runtime, CallError> {
    static DRIVER: std::sync::OnceLock<Result<tokio::runtime::Runtime, String>> =
        std::sync::OnceLock::new();
    DRIVER
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("wasmop-sandbox-timers")
                .enable_time()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| CallError::Sandbox {
            detail: format!("cannot start the sandbox's timer thread: {e}"),
        })
}

fn flatten<W, T>(
    out: Outcome<W>,
    cap: usize,
    size: impl FnOnce(&W) -> usize,
    convert: impl FnOnce(W) -> Result<T, CallError>,
) -> Outcome<T> {
    let Outcome { result, mut stats } = out;
    let started = Instant::now();
    let result = result.and_then(|w| {
        let n = size(&w);
        if n > cap {
            return Err(CallError::OutputTooLarge {
                size: n,
                limit: cap,
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
    output_cap: usize,
    stage: Stage,
) -> CallError {
    let state = store.data();
    // wasmtime's hostcall fuel ran out: the guest handed the host more bytes in one transfer
    // than the output cap allows. The error type is private; its message is stable.
    if e.chain()
        .any(|c| c.to_string().contains("fuel allocated for hostcalls"))
    {
        return CallError::OutputTooLarge {
            size: hostcall_fuel(output_cap),
            limit: output_cap,
        };
    }
    let memory_denied = e
        .chain()
        .any(|c| c.downcast_ref::<MemoryCapExceeded>().is_some());
    if memory_denied || state.limiter.denied.is_some() {
        return CallError::Memory {
            requested: state.limiter.denied.unwrap_or_default(),
            limit: limits.memory_bytes,
        };
    }
    // What the module printed ends up in Events, conditions and log lines: inert, so it cannot
    // forge a line or drive a terminal.
    let raw = state.stderr_tail(2048);
    let stderr = text::inert(&raw).into_owned();
    match e.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => CallError::Deadline {
            deadline: limits.deadline,
        },
        Some(Trap::UnreachableCodeReached) if !raw.is_empty() => CallError::Panic {
            message: text::inert(&panic_message(&raw)).into_owned(),
        },
        Some(trap) => CallError::Trap {
            trap: trap.to_string(),
            stderr,
        },
        None if stage == Stage::Exports => CallError::Interface {
            detail: format!("{e:#}"),
        },
        // Pool limits and system resources (the module's sizes were checked when it compiled).
        None if stage == Stage::Instantiate => CallError::Sandbox {
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

    /// A module's name and version reach the host's log lines as they are (`module = %name`
    /// in the text format, which does not escape newlines): one that could forge a log line is
    /// refused at load, as a condition type with control characters is.
    #[test]
    fn a_module_name_or_version_that_could_forge_a_log_line_is_refused() {
        let named = |name: &str, version: &str| ModuleMetadata {
            name: name.into(),
            version: version.into(),
            primary: crate::contract::Gvk::new("example.com/v1", "App"),
            ..placeholder_metadata()
        };
        assert!(check_metadata(&named("app", "1.0")).is_ok());
        for (name, version) in [
            ("app\nINFO forged", "1"),
            ("app", "1\r\u{1b}[2J"),
            ("app\u{202e}", "1"),
        ] {
            let checked = check_metadata(&named(name, version));
            assert!(
                matches!(&checked, Err(LoadError::Metadata(m)) if !m.chars().any(crate::text::is_unsafe_char)),
                "{name:?} {version:?}: {checked:?}"
            );
        }
    }

    #[test]
    fn panic_messages_are_extracted_from_rust_panic_reports() {
        let report = "thread '<unnamed>' panicked at src/lib.rs:10:5:\nboom: 42\nnote: run with `RUST_BACKTRACE=1` environment variable to display a backtrace";
        assert_eq!(panic_message(report), "boom: 42 (at src/lib.rs:10:5)");
        assert_eq!(panic_message("abort: oops"), "abort: oops");
    }

    /// A component exporting the guest interface with every function of it named right and
    /// typed `func()`: it compiles and links, and its exports fail their type check.
    const WRONG_TYPES: &str = r#"(component
        (core module $m (func (export "f")))
        (core instance $i (instantiate $m))
        (func $f (canon lift (core func $i "f")))
        (instance $guest
            (export "metadata" (func $f))
            (export "reconcile" (func $f))
            (export "finalize" (func $f))
            (export "validate" (func $f)))
        (export "wasmop:reconciler/guest@0.1.0" (instance $guest)))"#;

    #[test]
    fn a_module_with_the_right_names_but_wrong_types_is_refused_not_deferred() {
        let engine = Engine::new(&EngineConfig {
            max_instances: 2,
            max_calls: 2,
            ..EngineConfig::default()
        })
        .expect("engine");
        let bytes = wat::parse_str(WRONG_TYPES).expect("the component text parses");
        let err = engine
            .load(&bytes, &Limits::default())
            .expect_err("the module must be refused");
        assert!(err.is_module_fault(), "blamed on the host: {err}");
        assert!(matches!(err, LoadError::TypeMismatch { .. }), "{err}");
    }

    fn widget(mode: &str) -> ReconcileRequest {
        use crate::contract::{Context, Gvk, KindObjects, Trigger};
        ReconcileRequest {
            primary: serde_json::json!({
                "apiVersion": "test.wasmop.dev/v1", "kind": "Widget",
                "metadata": {"name": format!("w-{mode}"), "namespace": "ns", "uid": "u"},
                "spec": {"mode": mode}
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
                attempt: 1,
                config: "{}".into(),
                now_unix_ms: 0,
            },
        }
    }

    /// A tiered engine for two calls at once, compiling into `cache_dir` if given.
    fn tiered_engine(cache_dir: Option<PathBuf>) -> Engine {
        Engine::new(&EngineConfig {
            max_instances: 2,
            max_calls: 2,
            tiered: true,
            cache_dir,
            ..EngineConfig::default()
        })
        .expect("engine")
    }

    /// The fast tier's builds carry no native unwind info: a guest's trap, panic, endless loop
    /// and memory grab must still end as the optimized build's do (host/tests/engine.rs).
    #[test]
    fn a_fast_build_stops_misbehaving_guests_as_the_optimized_build_does() {
        let engine = tiered_engine(None);
        // The only background permit: the optimized build waits, the fast one serves throughout.
        let permit = engine.compiles.acquire();
        let bytes = wasmop_test_modules::bytes(wasmop_test_modules::MISBEHAVE);
        let module = engine.load(&bytes, &Limits::default()).expect("loads");
        let limits = Limits {
            deadline: Duration::from_millis(300),
            memory_bytes: 32 << 20,
            output_bytes: 1 << 20,
            log_lines: 10,
        };
        let call = |mode: &str| module.reconcile(widget(mode), &limits).result;
        let good = || {
            let response = call("good").expect("the good widget reconciles");
            assert_eq!(
                response.children[0].objects[0]["metadata"]["name"],
                "w-good-out"
            );
        };
        good();
        assert_eq!(
            call("loop").expect_err("an endless loop"),
            CallError::Deadline {
                deadline: Duration::from_millis(300)
            }
        );
        good();
        let err = call("memory").expect_err("a memory grab");
        assert!(matches!(err, CallError::Memory { .. }), "{err:?}");
        good();
        let err = call("panic").expect_err("a panic");
        assert!(
            matches!(&err, CallError::Panic { message } if message.contains("deliberate panic")),
            "{err:?}"
        );
        good();
        assert_eq!(
            module.tier(),
            Tier::Fast,
            "every call ran on the fast build"
        );
        drop(module);
        drop(permit);
    }

    /// The optimizing compile runs on a thread of its own, after the load returns, with the
    /// module's bytes: a digested module's, shared, not a copy (18 MB for a Python module).
    #[test]
    fn the_background_compile_shares_a_digested_module_s_bytes() {
        let engine = tiered_engine(None);
        // The only background permit: the optimizing thread waits for it, holding the bytes.
        let permit = engine.compiles.acquire();
        let digested = Digested::new(wasmop_test_modules::bytes(wasmop_test_modules::MISBEHAVE));
        let module = engine
            .load_digested(&digested, &Limits::default())
            .expect("loads");
        assert_eq!(module.tier(), Tier::Fast);
        assert_eq!(
            Arc::strong_count(&digested.shared()),
            3,
            "held by the digested module, this count's handle and the optimizing thread"
        );
        drop(module);
        drop(permit);
    }

    /// While the optimized build waits for a compile permit, the fast build serves mapped from
    /// the compiled cache, not from the anonymous copy the compile made.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_waiting_fast_build_serves_mapped_from_the_cache() {
        let dir = tempfile::tempdir().expect("tempdir");
        let engine = tiered_engine(Some(dir.path().to_path_buf()));
        let permit = engine.compiles.acquire();
        let bytes = wasmop_test_modules::bytes(wasmop_test_modules::MISBEHAVE);
        let module = engine.load(&bytes, &Limits::default()).expect("loads");
        assert_eq!(module.compiled(), Compiled::Fresh);
        let entry = format!("{}/{}-", dir.path().display(), module.sha256());
        let mapped = || {
            std::fs::read_to_string("/proc/self/maps")
                .expect("/proc/self/maps")
                .lines()
                .any(|l| l.contains(&entry) && l.ends_with(".cwasm"))
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        while !mapped() {
            assert!(
                Instant::now() < deadline,
                "the fast build was never mapped from {entry}*.cwasm"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let response = module
            .reconcile(widget("good"), &Limits::default())
            .result
            .expect("the mapped fast build reconciles");
        assert_eq!(
            response.children[0].objects[0]["metadata"]["name"],
            "w-good-out"
        );
        assert_eq!(module.tier(), Tier::Fast, "the optimized build waited");
        drop(module);
        drop(permit);
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
