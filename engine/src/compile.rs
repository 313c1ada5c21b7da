//! Compiling a component in a throwaway compiler, so the compiler's memory is given back.
//!
//! A `wasmtime::Engine` keeps every Cranelift compilation context it ever used (one per compile
//! thread) for reuse, and each context keeps its register allocator's arena at the largest size
//! any function needed. For the 1 MB image-updater example (built at opt-level 3) that arena
//! alone was ~240 MiB after one optimized compile, held for the life of the engine: it was most
//! of an idle host's memory (docs/benchmarks.md, "Idle host"). wasmtime has no call to drop
//! those contexts, so modules are compiled by a [`Compiler`]: a short-lived engine with the
//! serving engine's configuration (but the on-demand allocator: it never runs code), whose
//! artifact is loaded into the serving engine; dropping the compiler frees its contexts.
//!
//! # Guarantees
//! - The compiled code is the code the serving engine would have compiled itself: the compiler's
//!   configuration is the serving engine's, and wasmtime refuses to load an artifact whose
//!   compilation settings differ (a [`LoadError::Compile`], never undefined behaviour).
//! - Peak memory during a compile is unchanged; what the compile took is freed when it ends, and
//!   on glibc handed back to the kernel (`malloc_trim`, see [`give_back_freed_memory`]).
//!
//! # Errors
//! [`LoadError::Compile`] when the bytes do not compile or the artifact does not load.

use wasmtime::component::Component;

use super::LoadError;
use super::cache::ArtifactCache;

/// How to build the throwaway engine that compiles for a serving engine.
#[derive(Clone)]
pub(crate) struct Compiler {
    config: wasmtime::Config,
}

impl Compiler {
    /// A compiler for engines made from `serving` (its allocation strategy is replaced by the
    /// on-demand one: the compiler only compiles).
    pub(crate) fn new(serving: &wasmtime::Config) -> Compiler {
        let mut config = serving.clone();
        config.allocation_strategy(wasmtime::InstanceAllocationStrategy::OnDemand);
        Compiler { config }
    }

    /// Compiles `bytes` in a fresh engine, then loads the artifact into `engine` (made from the
    /// configuration this compiler was made from) and drops the compiling engine.
    ///
    /// # Errors
    /// See the module docs.
    pub(crate) fn compile(
        &self,
        engine: &wasmtime::Engine,
        bytes: &[u8],
    ) -> Result<Component, LoadError> {
        let artifact = self.precompile(bytes)?;
        let component = load(engine, &artifact);
        drop(artifact);
        give_back_freed_memory();
        component
    }

    /// As [`Compiler::compile`], but writes the artifact to `cache` (under `sha256`) first and
    /// maps it from there (see [`ArtifactCache::get`]), so the serving engine holds file-backed
    /// pages instead of a copy. If the entry cannot be written or read back, the artifact is
    /// loaded from memory as [`Compiler::compile`] does (logged).
    ///
    /// # Errors
    /// See the module docs.
    pub(crate) fn compile_into_cache(
        &self,
        engine: &wasmtime::Engine,
        bytes: &[u8],
        cache: &ArtifactCache,
        sha256: &str,
    ) -> Result<Component, LoadError> {
        let artifact = self.precompile(bytes)?;
        let mapped = match cache.put_artifact(sha256, &artifact) {
            Ok(()) => cache.get(engine, sha256),
            Err(e) => {
                tracing::warn!(target: "wasmop::engine::compile", dir = %cache.dir().display(), error = %e, "cannot write the compiled-module cache; the next load compiles again");
                None
            }
        };
        let component = match mapped {
            Some(component) => Ok(component),
            None => load(engine, &artifact),
        };
        drop(artifact);
        give_back_freed_memory();
        component
    }

    /// Compiles `bytes` in a fresh engine and drops it: the artifact, for this compiler's
    /// engines.
    fn precompile(&self, bytes: &[u8]) -> Result<Vec<u8>, LoadError> {
        fix_allocator_thresholds();
        let compiler = wasmtime::Engine::new(&self.config)
            .map_err(|e| LoadError::Compile(format!("starting the compiler: {e:#}")))?;
        compiler
            .precompile_component(bytes)
            .map_err(|e| LoadError::Compile(format!("{e:#}")))
    }
}

/// Loads a freshly compiled `artifact` into `engine` (a copy in memory).
fn load(engine: &wasmtime::Engine, artifact: &[u8]) -> Result<Component, LoadError> {
    // SAFETY: `deserialize` trusts that the bytes were produced by wasmtime's compiler for a
    // compatible engine. They were: `precompile_component` produced them just now, in this
    // process, from an engine configured like `engine` (same compilation settings), and
    // wasmtime checks the artifact's compatibility header against `engine` before using it.
    #[allow(unsafe_code)]
    let component = unsafe { Component::deserialize(engine, artifact) };
    component.map_err(|e| {
        LoadError::Compile(format!(
            "loading the freshly compiled artifact into the serving engine: {e:#}"
        ))
    })
}

/// Fixes glibc's mmap and trim thresholds at 128 KiB (their initial values), once per process,
/// before the first compile. glibc raises both as large blocks are freed (the mmap threshold up
/// to 32 MiB, the trim threshold to twice that), after which the compile threads' large
/// allocations come from their arenas and stay there when freed: after 20 fresh compiles with
/// tiering on, 171 MiB of an idle engine's 213.5 MiB was such freed memory, and 58.7 MiB
/// remained with the thresholds fixed (docs/benchmarks.md, "Idle host memory"). Fixed
/// thresholds make every allocation of 128 KiB or more its own mapping, given back when freed; on
/// the reconcile path such allocations are rare (a request is the primary and its children as
/// JSON text). Other C libraries (musl, in the release image) are left alone.
fn fix_allocator_thresholds() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            // SAFETY: `mallopt` only changes the C allocator's tuning parameters; it may be
            // called at any time from any thread.
            #[allow(unsafe_code)]
            unsafe {
                libc::mallopt(libc::M_MMAP_THRESHOLD, 128 << 10);
                libc::mallopt(libc::M_TRIM_THRESHOLD, 128 << 10);
            }
        });
    }
}

/// Hands the memory the compile freed back to the kernel. glibc keeps freed memory in the arena
/// of the thread that allocated it and trims an arena only when a large free block sits at its
/// top; a compile (many threads, a register-allocator arena that grows in doubling chunks)
/// leaves its arenas almost empty but resident: 765 MiB of the 916 MiB that glibc held after 20
/// modules were compiled, with 4.7 MiB in use (`make bench-engine-memory`, glibc's
/// `malloc_stats`). `malloc_trim(0)` releases the free pages of every arena. Once per compile,
/// which takes seconds, it costs nothing that shows. Other C libraries (musl, in the release
/// image) give large freed blocks back by themselves.
fn give_back_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only releases free memory of the C allocator; it touches no memory
    // in use and is safe to call from any thread at any time.
    #[allow(unsafe_code)]
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The smallest component: no imports, no exports.
    const EMPTY_COMPONENT: &[u8] = b"\0asm\x0d\0\x01\0";

    fn config(epochs: bool) -> wasmtime::Config {
        let mut c = wasmtime::Config::new();
        c.epoch_interruption(epochs);
        c
    }

    #[test]
    fn a_compile_loads_into_the_engine_it_was_made_for() {
        let serving = config(true);
        let engine = wasmtime::Engine::new(&serving).expect("engine");
        let component = Compiler::new(&serving).compile(&engine, EMPTY_COMPONENT);
        assert!(component.is_ok(), "{:?}", component.err());
    }

    #[test]
    fn an_artifact_of_other_settings_is_refused_not_run() {
        let engine = wasmtime::Engine::new(&config(true)).expect("engine");
        let Err(err) = Compiler::new(&config(false)).compile(&engine, EMPTY_COMPONENT) else {
            panic!("compiled without epoch interruption, yet loaded by an engine with it");
        };
        assert!(
            matches!(&err, LoadError::Compile(m) if m.contains("serving engine")),
            "{err}"
        );
    }

    #[test]
    fn bytes_that_do_not_compile_are_a_compile_error() {
        let engine = wasmtime::Engine::new(&config(true)).expect("engine");
        let Err(err) = Compiler::new(&config(true)).compile(&engine, b"\0asm\x0d\0\x01\0\x7f")
        else {
            panic!("trailing garbage compiled");
        };
        assert!(matches!(err, LoadError::Compile(_)), "{err}");
    }
}
