//! What can go wrong loading or calling a module.

use std::path::PathBuf;
use std::time::Duration;

/// A module could not be loaded. Each variant says what the author or admin should do.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The bytes are not WebAssembly at all.
    #[error(
        "not a WebAssembly module ({len} bytes, starting {head:02x?}): expected the `\\0asm` magic; push the `.wasm` file built with `cargo build --release --target wasm32-wasip2`"
    )]
    NotWasm {
        /// Size of the input.
        len: usize,
        /// Its first bytes.
        head: Vec<u8>,
    },
    /// A core module, not a component.
    #[error(
        "a core WebAssembly module, not a component: build the module for `wasm32-wasip2` (which links a component), or wrap it with `wasm-tools component new`"
    )]
    CoreModule,
    /// Cranelift refused it (invalid or unsupported Wasm).
    #[error("the component does not compile: {0}")]
    Compile(String),
    /// It implements another version of the contract.
    #[error(
        "the module implements {found} but this host serves wasmop:reconciler@{supported}: rebuild it against wasmop-sdk for {supported} (or run a host that serves {found})"
    )]
    VersionMismatch {
        /// What the module has (`wasmop:reconciler/guest@0.2.0`).
        found: String,
        /// What the host serves.
        supported: &'static str,
    },
    /// It does not export the `guest` interface, or lacks functions of it.
    #[error(
        "the module does not implement the wasmop:reconciler@{supported} world: missing {missing}; it exports [{exports}]; build it with wasmop-sdk's `export!`"
    )]
    MissingExports {
        /// What is missing.
        missing: String,
        /// What it exports.
        exports: String,
        /// The version the host serves.
        supported: &'static str,
    },
    /// It imports something the host does not provide.
    #[error(
        "the module imports {import}, which a wasmop host does not provide (modules may import wasmop:reconciler/host and WASI 0.2 interfaces only)"
    )]
    UnsupportedImport {
        /// The import's name.
        import: String,
    },
    /// Its imports or exports have the right names but wrong types.
    #[error("the module's interface does not match wasmop:reconciler@{supported}: {detail}")]
    TypeMismatch {
        /// The type checker's message.
        detail: String,
        /// The version the host serves.
        supported: &'static str,
    },
    /// `metadata()` failed or returned nonsense.
    #[error("the module's metadata() {0}")]
    Metadata(String),
    /// Its compile was under way when the host died `crashes` times in a row (an OOM kill, a
    /// compiler crash): refused before compiling, so one module does not crash-loop every
    /// replica ([`crate::quarantine`]).
    #[error(
        "module sha256 {sha256} is quarantined: the host died {crashes} times in a row while compiling it (out of memory, or a compiler crash); push another module, or delete {markers} in the compiled-module cache to try it again"
    )]
    Quarantined {
        /// The module's sha256.
        sha256: String,
        /// The consecutive crashes counted.
        crashes: u32,
        /// The marker files to delete to clear it.
        markers: String,
    },
    /// No sandbox was free to call `metadata()`: the host is busy, the module is not at fault
    /// (see [`LoadError::is_module_fault`]); loading it again later may succeed.
    #[error("cannot read the module's metadata() now: {0}")]
    Busy(CallError),
    /// It needs more of the sandbox than the engine or the call limits give any module.
    #[error("the module needs {needs} {what}, more than the {allowed} allowed: {advice}")]
    Needs {
        /// What it needs (`core-module instances`).
        what: &'static str,
        /// How many.
        needs: u64,
        /// The limit.
        allowed: u64,
        /// What to do.
        advice: &'static str,
    },
    /// The compiled-artifact cache could not be written (loading still fails only if compiling
    /// failed; this is reported for `wasmop inspect --cache`).
    #[error("cannot use the compiled-module cache {path}: {source}")]
    Cache {
        /// The cache path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The engine could not be built.
    #[error("cannot configure the Wasm engine: {0}")]
    Engine(String),
}

impl LoadError {
    /// Whether the module is to blame (its version may be refused for good), rather than the
    /// host being out of sandboxes or the cache directory failing.
    pub fn is_module_fault(&self) -> bool {
        !matches!(self, LoadError::Busy(_) | LoadError::Cache { .. })
    }
}

/// A call into a module failed. The host never panics or aborts because of a module: every
/// failure is one of these.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// The call ran past its wall-clock deadline and was interrupted.
    #[error(
        "the module ran past its deadline of {deadline:?} and was stopped (an endless loop, or too much work per reconcile: raise spec.limits.deadline if the work is legitimate)"
    )]
    Deadline {
        /// The deadline.
        deadline: Duration,
    },
    /// The module tried to grow its memory past the cap.
    #[error(
        "the module tried to grow its memory to {requested} bytes, over its cap of {limit} bytes, and was stopped (raise spec.limits.memory if legitimate)"
    )]
    Memory {
        /// What it asked for.
        requested: u64,
        /// The cap.
        limit: u64,
    },
    /// The module panicked (Rust) or aborted; the message is what it printed.
    #[error("the module panicked: {message}")]
    Panic {
        /// The panic message.
        message: String,
    },
    /// Any other trap (out-of-bounds access, stack overflow...).
    #[error("the module trapped: {trap}{}", if .stderr.is_empty() { String::new() } else { format!(" (it printed: {})", .stderr) })]
    Trap {
        /// The trap.
        trap: String,
        /// The tail of what it printed to stderr.
        stderr: String,
    },
    /// The module returned text that is not the JSON it should be.
    #[error("the module returned malformed output: {detail}")]
    Malformed {
        /// Where and what.
        detail: String,
    },
    /// The module returned more than the output cap (or handed the host more than the cap's
    /// hostcall fuel in one transfer, which stops the copy early).
    #[error(
        "the module returned {size} bytes or more of output, over the cap of {limit} bytes (the host stopped copying it)"
    )]
    OutputTooLarge {
        /// Size returned, or the bytes copied before the host stopped.
        size: usize,
        /// Cap.
        limit: usize,
    },
    /// The module returned its own error.
    #[error("the module reported an error: {message}")]
    Module {
        /// The module's message.
        message: String,
    },
    /// No sandbox could be created (for example, the instance pool is exhausted).
    #[error("could not create a sandbox for the module: {detail}")]
    Sandbox {
        /// Why.
        detail: String,
    },
    /// The module's exports have the names of the contract but not its types (found when a
    /// sandbox is made; [`Engine::load`](crate::Engine::load) reports it as
    /// [`LoadError::TypeMismatch`]). The module's fault, unlike [`CallError::Sandbox`].
    #[error("the module's exports do not have the types of the contract: {detail}")]
    Interface {
        /// The type checker's message.
        detail: String,
    },
    /// The call waited in the host's call queue until its deadline passed: every sandbox slot
    /// was busy. The host was overloaded; the module did nothing wrong.
    #[error(
        "no sandbox slot became free within the call's deadline of {deadline:?} ({slots} module calls were running): the host is busy, not the module; raise `wasmop run --max-module-calls` or lower the reconcilers' concurrency"
    )]
    Queued {
        /// The call's deadline.
        deadline: Duration,
        /// How many calls may run at once.
        slots: usize,
    },
}

impl CallError {
    /// A short, stable name for metrics and Event reasons (`Deadline`, `Memory`...).
    pub fn reason(&self) -> &'static str {
        match self {
            CallError::Deadline { .. } => "ModuleDeadlineExceeded",
            CallError::Memory { .. } => "ModuleMemoryExceeded",
            CallError::Panic { .. } => "ModulePanicked",
            CallError::Trap { .. } => "ModuleTrapped",
            CallError::Malformed { .. } => "ModuleOutputMalformed",
            CallError::OutputTooLarge { .. } => "ModuleOutputTooLarge",
            CallError::Module { .. } => "ModuleError",
            CallError::Sandbox { .. } => "SandboxUnavailable",
            CallError::Interface { .. } => "ModuleInvalid",
            CallError::Queued { .. } => "SandboxBusy",
        }
    }

    /// Whether the module itself is to blame (counted for backoff, Warning Events and
    /// rollback), rather than the host being out of sandboxes.
    pub fn is_module_fault(&self) -> bool {
        !matches!(self, CallError::Sandbox { .. } | CallError::Queued { .. })
    }
}
