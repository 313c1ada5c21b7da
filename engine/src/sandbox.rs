//! The per-call sandbox state: WASI with nothing granted (clocks and randomness derived from the
//! request, [`super::determinism`]), the memory limiter, the log budget.
//!
//! # Guarantees
//! - A module's log line is inert: control characters (newline, carriage return, ESC, NUL...),
//!   Unicode line separators and bidirectional overrides are escaped (`\n`, `\u{1b}`...), so a
//!   line cannot forge a host log line, move the cursor or recolour a terminal.
//! - A call logs at most its line budget and [`MAX_LOG_BYTES`] of escaped text, each line at
//!   most 4 KiB after escaping; the rest is dropped and counted.

use wasmtime::ResourceLimiter;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::bindings::wasmop::reconciler::host::{Host, LogLevel};
use super::determinism::Entropy;
use super::text::{cut, inert};

/// How much of a module's stderr is kept (for panic messages).
const STDERR_CAPACITY: usize = 64 * 1024;
/// The longest log line kept (`...` included); longer lines are cut.
const LOG_LINE_MAX: usize = 4096;
/// The most WASI resource handles a call holds at once (streams, pollables, descriptors).
pub(crate) const MAX_HANDLES: usize = 10_000;
/// The most bytes of log lines one call emits (escaped); lines past it are dropped, counted.
pub(crate) const MAX_LOG_BYTES: usize = 256 << 10;

/// The store data of one call.
pub(crate) struct State {
    wasi: WasiCtx,
    table: ResourceTable,
    pub(crate) limiter: Limiter,
    pub(crate) stderr: MemoryOutputPipe,
    module: std::sync::Arc<str>,
    log_budget: usize,
    /// The bytes of the lines logged so far (at most [`MAX_LOG_BYTES`]).
    pub(crate) log_bytes: usize,
    pub(crate) logs_dropped: usize,
}

impl State {
    pub(crate) fn new(
        module: std::sync::Arc<str>,
        memory_cap: u64,
        log_budget: usize,
        entropy: &Entropy,
    ) -> Self {
        let stderr = MemoryOutputPipe::new(STDERR_CAPACITY);
        // No preopened directories, no environment, no arguments, no network (all addresses are
        // denied by default and name lookup is off), stdin closed, stdout discarded; clocks and
        // randomness from the request, not the host.
        let mut wasi = WasiCtx::builder();
        wasi.stderr(stderr.clone())
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false);
        entropy.install(&mut wasi);
        let wasi = wasi.build();
        let mut table = ResourceTable::new();
        table.set_max_capacity(MAX_HANDLES);
        State {
            wasi,
            table,
            limiter: Limiter::new(memory_cap),
            stderr,
            module,
            log_budget,
            log_bytes: 0,
            logs_dropped: 0,
        }
    }

    /// What the module printed to stderr (lossy UTF-8), at most the last `max` bytes.
    pub(crate) fn stderr_tail(&self, max: usize) -> String {
        let bytes = self.stderr.contents();
        let start = bytes.len().saturating_sub(max);
        String::from_utf8_lossy(&bytes[start..]).trim().to_string()
    }
}

impl WasiView for State {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl Host for State {
    fn log(&mut self, level: LogLevel, message: String) {
        if self.log_budget == 0 {
            self.logs_dropped += 1;
            return;
        }
        // Escaped first, then cut: escaping grows a line up to six times.
        let message = cut(inert(&message).into_owned(), LOG_LINE_MAX);
        if self.log_bytes + message.len() > MAX_LOG_BYTES {
            self.log_budget = 0;
            self.logs_dropped += 1;
            return;
        }
        self.log_budget -= 1;
        self.log_bytes += message.len();
        let module = &*self.module;
        match level {
            LogLevel::Trace => tracing::trace!(target: "wasmop::module", module, "{message}"),
            LogLevel::Debug => tracing::debug!(target: "wasmop::module", module, "{message}"),
            LogLevel::Info => tracing::info!(target: "wasmop::module", module, "{message}"),
            LogLevel::Warn => tracing::warn!(target: "wasmop::module", module, "{message}"),
            LogLevel::Error => tracing::error!(target: "wasmop::module", module, "{message}"),
        }
    }
}

/// Caps the call's linear memory, all its memories together, and records the high-water mark;
/// caps its table elements and how many instances, memories and tables it may create.
///
/// *Guarantees:* the cap is on the sum of every memory of the call's store (a component may
/// instantiate a core module many times, each with a memory of its own), whichever allocator
/// serves it (the fast tier's on-demand allocator has no pool limits).
pub(crate) struct Limiter {
    cap: u64,
    /// The bytes of every memory of the store, and of every table's elements.
    memory: u64,
    elements: u64,
    pub(crate) peak: u64,
    pub(crate) denied: Option<u64>,
}

/// The most table elements a call's tables hold together.
pub(crate) const MAX_TABLE_ELEMENTS: u64 = 1_000_000;
/// The most core instances, memories and tables a call creates (a Python module takes 14 core
/// instances; a module needs at most `MAX_CORE_INSTANCES_PER_MODULE` to load).
pub(crate) const MAX_STORE_INSTANCES: usize = 64;
pub(crate) const MAX_STORE_MEMORIES: usize = 64;
pub(crate) const MAX_STORE_TABLES: usize = 256;

/// The error a denied memory growth traps with (found again in the error chain).
#[derive(Debug)]
pub(crate) struct MemoryCapExceeded;

impl std::fmt::Display for MemoryCapExceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("memory cap exceeded")
    }
}

impl std::error::Error for MemoryCapExceeded {}

impl Limiter {
    fn new(cap: u64) -> Self {
        Limiter {
            cap,
            memory: 0,
            elements: 0,
            peak: 0,
            denied: None,
        }
    }
}

impl ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        // A memory's first allocation comes here too, from 0.
        let total = self
            .memory
            .saturating_sub(current as u64)
            .saturating_add(desired as u64);
        if total > self.cap {
            self.denied = Some(total);
            return Err(wasmtime::Error::new(MemoryCapExceeded));
        }
        self.memory = total;
        self.peak = self.peak.max(total);
        Ok(true)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let total = self
            .elements
            .saturating_sub(current as u64)
            .saturating_add(desired as u64);
        if total > MAX_TABLE_ELEMENTS {
            return Ok(false);
        }
        self.elements = total;
        Ok(true)
    }

    fn instances(&self) -> usize {
        MAX_STORE_INSTANCES
    }

    fn memories(&self) -> usize {
        MAX_STORE_MEMORIES
    }

    fn tables(&self) -> usize {
        MAX_STORE_TABLES
    }
}

#[cfg(test)]
mod tests {
    use super::inert;
    use super::{Limiter, MAX_TABLE_ELEMENTS};
    use wasmtime::ResourceLimiter as _;

    /// A call's state: a 16 MiB cap, 1,000 log lines.
    fn state() -> super::State {
        super::State::new(
            "m".into(),
            16 << 20,
            1000,
            &super::super::determinism::Entropy::FIXED,
        )
    }

    /// A guest's WASI handles (a pollable per `subscribe-duration`, never dropped) live in
    /// host memory no limiter sees: at most [`super::MAX_HANDLES`] per call, not wasmtime's
    /// default of 1,000,000 (hundreds of MiB per call).
    #[test]
    fn a_calls_wasi_handles_are_bounded() {
        let mut state = state();
        let pushed = (0..=super::MAX_HANDLES)
            .map(|_| state.table.push(()))
            .take_while(Result::is_ok)
            .count();
        assert_eq!(pushed, super::MAX_HANDLES);
    }

    /// A call's logs are bounded in bytes, not only in lines: 1,000 lines of 4 KiB of control
    /// characters (each escaped to up to 6 bytes) made ~24 MiB of log per call, at every
    /// requeue.
    #[test]
    fn a_calls_log_lines_are_bounded_in_bytes() {
        use super::super::bindings::wasmop::reconciler::host::{Host as _, LogLevel};
        let mut state = state();
        for _ in 0..1000 {
            state.log(LogLevel::Trace, "\u{1}".repeat(4096));
        }
        assert!(
            state.log_bytes <= super::MAX_LOG_BYTES,
            "{} bytes logged",
            state.log_bytes
        );
        assert!(state.logs_dropped > 0);
    }

    /// The memory cap is the call's: four memories of 16 MiB under a 16 MiB cap (a component
    /// instantiating a core module four times) are refused at the second, not allowed each.
    #[test]
    fn the_memory_cap_counts_every_memory_of_the_call() {
        const MIB: usize = 1 << 20;
        let mut limiter = Limiter::new(16 << 20);
        assert!(limiter.memory_growing(0, 8 * MIB, None).is_ok_and(|ok| ok));
        assert!(
            limiter
                .memory_growing(8 * MIB, 12 * MIB, None)
                .is_ok_and(|ok| ok)
        );
        assert!(limiter.memory_growing(0, 4 * MIB, None).is_ok_and(|ok| ok));
        assert!(
            limiter.memory_growing(0, MIB, None).is_err(),
            "17 MiB in all"
        );
        assert_eq!(limiter.peak, 16 << 20);
        assert_eq!(limiter.denied, Some(17 << 20));
        let mut tables = Limiter::new(16 << 20);
        let half = usize::try_from(MAX_TABLE_ELEMENTS / 2).unwrap_or(usize::MAX);
        assert!(tables.table_growing(0, half, None).is_ok_and(|ok| ok));
        assert!(tables.table_growing(0, half, None).is_ok_and(|ok| ok));
        assert!(tables.table_growing(0, 1, None).is_ok_and(|ok| !ok));
    }

    #[test]
    fn module_log_lines_cannot_forge_host_lines_or_drive_the_terminal() {
        let forged =
            "done\n2026-01-01T00:00:00Z  INFO wasmop::host: leader elected\r\u{1b}[2J\0\u{202e}";
        let shown = inert(forged);
        assert!(!shown.chars().any(char::is_control), "{shown:?}");
        assert_eq!(
            shown,
            "done\\n2026-01-01T00:00:00Z  INFO wasmop::host: leader elected\\r\\u{1b}[2J\\u{0}\\u{202e}"
        );
        // Ordinary text, tabs aside, is untouched (and not copied).
        assert!(matches!(
            inert("réconcilié 3 objets"),
            std::borrow::Cow::Borrowed(_)
        ));
        assert_eq!(inert("a\tb"), "a\\tb");
    }
}
