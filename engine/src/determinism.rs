//! The clocks and randomness a sandbox hands its module: derived from the request alone.
//!
//! # Guarantees
//! - The same request gives the same readings and the same random bytes, call after call and in
//!   every mode (`wasmop test`, `wasmop diff`, replays, live calls): a module's output depends on
//!   its request only.
//! - `wasi:clocks/wall-clock` starts at the request's `now-unix-ms` (validate requests carry no
//!   time: the Unix epoch) and `wasi:clocks/monotonic-clock` at 0; each reading advances the clock
//!   read by [`TICK`], so time moves forward within a call and a busy-wait on either clock ends.
//! - `wasi:random/random`, `wasi:random/insecure` and `wasi:random/insecure-seed` are seeded
//!   from the request's primary (or validated object), config, reconciler name and time.
//!
//! # Caveats
//! - The randomness is reproducible, so it is not secret: a module must not make keys or
//!   passwords from it.
//! - Sleeps and clock subscriptions still wait real time (bounded by the call's deadline).

use std::cell::Cell;
use std::convert::Infallible;
use std::time::Duration;

use wasmtime_wasi::WasiCtxBuilder;
use wasmtime_wasi::{HostMonotonicClock, HostWallClock};

use crate::contract::{ReconcileRequest, ValidateRequest};

/// How far a clock moves at each reading.
pub const TICK: Duration = Duration::from_micros(1);

/// What one call's clocks and randomness derive from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entropy {
    now_unix_ms: u64,
    seed: u64,
}

impl Entropy {
    /// For `metadata()`, whose request is empty: the Unix epoch and a fixed seed.
    pub(crate) const FIXED: Entropy = Entropy {
        now_unix_ms: 0,
        seed: 0,
    };

    /// For a reconcile or finalize call: the request's time; a seed of its primary, config,
    /// reconciler and time (not the trigger or attempt, so `wasmop test` of a recorded request
    /// sees what the live call saw).
    pub(crate) fn of_reconcile(r: &ReconcileRequest) -> Self {
        let c = &r.context;
        let parts = [
            c.reconciler.as_bytes(),
            c.config.as_bytes(),
            r.primary.as_bytes(),
        ];
        Entropy {
            now_unix_ms: c.now_unix_ms,
            seed: seed_of(c.now_unix_ms, &parts),
        }
    }

    /// For a validate call: the Unix epoch (the request carries no time); a seed of the objects
    /// and config.
    pub(crate) fn of_validate(r: &ValidateRequest) -> Self {
        let old = r.old.as_deref().unwrap_or_default();
        let parts = [r.config.as_bytes(), old.as_bytes(), r.new.as_bytes()];
        Entropy {
            now_unix_ms: 0,
            seed: seed_of(0, &parts),
        }
    }

    /// For a hook call: the request's time; a seed of its document.
    pub(crate) fn of_hook(now_unix_ms: u64, body: &str) -> Self {
        Entropy {
            now_unix_ms,
            seed: seed_of(now_unix_ms, &[body.as_bytes()]),
        }
    }

    /// Installs the clocks and generators on a WASI context being built.
    pub(crate) fn install(&self, wasi: &mut WasiCtxBuilder) {
        let mut seeds = SplitMix(self.seed);
        let wall = Duration::from_millis(self.now_unix_ms);
        wasi.wall_clock(FrozenWall(Ticks::starting(wall)))
            .monotonic_clock(FrozenMonotonic(Ticks::starting(Duration::ZERO)))
            .secure_random(SplitMix(seeds.next()))
            .insecure_random(SplitMix(seeds.next()))
            .insecure_random_seed((u128::from(seeds.next()) << 64) | u128::from(seeds.next()));
    }
}

/// XXH3 (64 bit) of `time` and `parts`, each part length-prefixed: a specified algorithm, so
/// stable across releases (unlike std's hasher), and it reads many bytes at a step, where the
/// FNV-1a it replaced took one (~5 us of a ~110 us call on a 6 KB primary, `make
/// bench-dispatch`).
fn seed_of(time: u64, parts: &[&[u8]]) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3Default::new();
    h.update(&time.to_le_bytes());
    for part in parts {
        h.update(&u64::try_from(part.len()).unwrap_or(u64::MAX).to_le_bytes());
        h.update(part);
    }
    h.digest()
}

/// A clock that advances by [`TICK`] at each reading.
struct Ticks {
    next: Cell<Duration>,
}

impl Ticks {
    fn starting(at: Duration) -> Self {
        Ticks {
            next: Cell::new(at),
        }
    }

    fn read(&self) -> Duration {
        let now = self.next.get();
        self.next.set(now.saturating_add(TICK));
        now
    }
}

/// `wasi:clocks/wall-clock`: the request's time, then [`TICK`] later at each reading.
struct FrozenWall(Ticks);

impl HostWallClock for FrozenWall {
    fn resolution(&self) -> Duration {
        TICK
    }

    fn now(&self) -> Duration {
        self.0.read()
    }
}

/// `wasi:clocks/monotonic-clock`: 0 at the start of the call, then [`TICK`] later at each reading.
struct FrozenMonotonic(Ticks);

impl HostMonotonicClock for FrozenMonotonic {
    fn resolution(&self) -> u64 {
        u64::try_from(TICK.as_nanos()).unwrap_or(1)
    }

    fn now(&self) -> u64 {
        u64::try_from(self.0.read().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// SplitMix64: a small, fast generator whose stream depends only on its seed.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

impl rand_core::TryRng for SplitMix {
    type Error = Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Infallible> {
        Ok(u32::try_from(self.next() >> 32).unwrap_or_default())
    }

    fn try_next_u64(&mut self) -> Result<u64, Infallible> {
        Ok(self.next())
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
        for chunk in dst.chunks_mut(8) {
            let bytes = self.next().to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clocks_start_at_the_request_and_advance_per_reading() {
        let wall = FrozenWall(Ticks::starting(Duration::from_millis(1_700_000_000_123)));
        assert_eq!(wall.now(), Duration::from_millis(1_700_000_000_123));
        assert_eq!(wall.now(), Duration::from_millis(1_700_000_000_123) + TICK);
        let mono = FrozenMonotonic(Ticks::starting(Duration::ZERO));
        assert_eq!((mono.now(), mono.now()), (0, 1_000));
    }

    #[test]
    fn the_seed_depends_on_every_part_and_its_boundaries() {
        let a = seed_of(1, &[b"ab", b"c"]);
        assert_eq!(a, seed_of(1, &[b"ab", b"c"]));
        assert_ne!(a, seed_of(1, &[b"a", b"bc"]));
        assert_ne!(a, seed_of(2, &[b"ab", b"c"]));
        let (mut x, mut y) = (SplitMix(a), SplitMix(a));
        assert_eq!((x.next(), x.next()), (y.next(), y.next()));
    }

    /// The seed is XXH3-64 as specified (the reference value of the empty input), so a release
    /// that updates the crate keeps every module's randomness.
    #[test]
    fn the_seed_hash_is_the_specified_xxh3() {
        assert_eq!(xxhash_rust::xxh3::xxh3_64(b""), 0x2d06_8005_38d3_94c2);
        let mut h = xxhash_rust::xxh3::Xxh3Default::new();
        h.update(b"");
        assert_eq!(h.digest(), 0x2d06_8005_38d3_94c2);
    }
}
