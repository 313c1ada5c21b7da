//! Tiered compilation: a module is activated with a quickly compiled build (Winch, wasmtime's
//! baseline compiler, or Cranelift without optimizations: [`FastCompiler`]) and its optimized build is compiled in the background and swapped in when
//! ready, so the time from a push to the first reconcile by a new module does not wait for the
//! optimizer (measured: 3-4x less compile time, see docs/benchmarks.md).
//!
//! # Guarantees
//! - Both builds are in the compiled cache by digest (separate entries per tier); a module whose
//!   optimized build is cached loads optimized at once. A fresh fast build, once written there
//!   (off the path to the first call), serves mapped from its entry while the optimized build
//!   waits for its turn.
//! - The swap is atomic for calls: a call uses the build that was current when it started; every
//!   clone of a [`super::Module`] sees the swap.
//! - Background compiles hold a [`CompileGate`] permit: at most `max_background_compiles` run at
//!   once, each single-threaded, so many pushes at once leave cores for reconciles; the memory
//!   compiles take is bounded by the same count. A module nobody holds any more is not compiled.
//! - A failed optimized compile leaves the fast build serving (logged); it never fails a module.

use std::sync::{Arc, Condvar, Mutex, PoisonError};

/// Which build of a module serves calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Tier {
    /// The fast compiler's build: quick to compile, slower to run.
    Fast,
    /// Cranelift optimizing for speed.
    Optimized,
}

impl std::fmt::Display for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Tier::Fast => "fast",
            Tier::Optimized => "optimized",
        })
    }
}

/// The compiler of the fast tier. Winch is the default: on the 1 MB Rust example it compiled in
/// 2.2 s against 8.4-9.6 s for Cranelift without optimizations and 10.1 s optimizing (one loaded
/// 2-core machine, `make bench-dispatch`); on the 18 MB Python example 8.4 s, 12.4 s and 34.6 s.
///
/// Winch compiles function bodies only: the trampolines of functions that escape (through a
/// table or an export; thousands in CPython) are compiled by Cranelift, without optimizations
/// in the fast tier (14-31% less time for the fast build in `make bench-hotswap-compile`).
///
/// Cranelift's incremental compilation cache (per function, so a new build that shares most of
/// its code with an earlier one compiles only what changed) does not beat Winch, even for two
/// componentize-py builds whose code sections are byte-identical: 95% hits, and the second
/// Python build still took 6.2 s without optimizations against 3.3 s for Winch; 4.4 s against
/// 0.24 s for two Rust builds (`make bench-hotswap-compile`). Translating every function to
/// Cranelift's IR and hashing it for the key costs more than Winch's whole compile, so the
/// engine does not use it. Winch itself cannot use the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FastCompiler {
    /// Cranelift with optimizations off.
    CraneliftNone,
    /// Winch, wasmtime's baseline compiler (x86-64 and aarch64).
    #[default]
    Winch,
}

/// A counting semaphore for compilations (blocking: compiles run off async threads).
#[derive(Debug)]
pub struct CompileGate {
    free: Mutex<usize>,
    freed: Condvar,
}

/// A compile permit; released on drop.
#[derive(Debug)]
pub struct CompilePermit {
    gate: Arc<CompileGate>,
}

impl CompileGate {
    /// A gate letting `permits` compiles run at once (at least one).
    pub fn new(permits: usize) -> Arc<Self> {
        Arc::new(CompileGate {
            free: Mutex::new(permits.max(1)),
            freed: Condvar::new(),
        })
    }

    /// Waits for a permit.
    pub fn acquire(self: &Arc<Self>) -> CompilePermit {
        let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        while *free == 0 {
            free = self
                .freed
                .wait(free)
                .unwrap_or_else(PoisonError::into_inner);
        }
        *free -= 1;
        CompilePermit { gate: self.clone() }
    }

    /// Permits free now.
    pub fn available(&self) -> usize {
        *self.free.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for CompilePermit {
    fn drop(&mut self) {
        let mut free = self
            .gate
            .free
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *free += 1;
        self.gate.freed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gate_lets_only_its_permits_through_and_frees_them_on_drop() {
        let gate = CompileGate::new(2);
        let a = gate.acquire();
        let _b = gate.acquire();
        assert_eq!(gate.available(), 0);
        let waiter = {
            let gate = gate.clone();
            std::thread::spawn(move || {
                let _c = gate.acquire();
            })
        };
        drop(a);
        waiter.join().expect("the waiter got the freed permit");
        assert_eq!(gate.available(), 1);
    }
}
