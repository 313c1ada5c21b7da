//! The on-disk cache of compiled modules, so a restart or a re-push skips compilation.
//!
//! Entries are keyed by the module's sha256 and a fingerprint of the engine (wasmtime version,
//! every compilation setting and the tier: fast or optimized),
//! `<dir>/<module-sha256>-<engine>.cwasm`, with a sidecar `.sha256` of the artifact itself.
//!
//! The directory is bounded: after each write, the least recently used entries (by modification
//! time, which a hit refreshes) are deleted until the entries total at most the size bound. The
//! entry just written is never evicted, even when it alone exceeds the bound.
//!
//! # Guarantees
//! - Writes are atomic (temp file + rename): a crash never leaves a half-written entry in place.
//! - An entry is only deserialized if its own checksum matches the sidecar; a corrupt, truncated
//!   or foreign entry is a miss (logged), never undefined behaviour from our side.
//! - Cache failures never fail a load: the module is compiled instead.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// The default bound of the compiled-module cache: a few dozen Rust modules or a few Python ones
/// (an optimized Python artifact is ~60 MB).
pub const DEFAULT_CACHE_MAX_BYTES: u64 = 1 << 30;

/// A directory of compiled artifacts.
#[derive(Debug, Clone)]
pub struct ArtifactCache {
    dir: PathBuf,
    engine_key: String,
    max_bytes: u64,
}

impl ArtifactCache {
    /// A cache in `dir` for artifacts of `engine` compiled at `tier` (`fast`, `optimized`),
    /// holding at most `max_bytes` of entries (all tiers together).
    pub(crate) fn new(dir: PathBuf, engine: &wasmtime::Engine, tier: &str, max_bytes: u64) -> Self {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        env!("CARGO_PKG_VERSION").hash(&mut h);
        engine.precompile_compatibility_hash().hash(&mut h);
        tier.hash(&mut h);
        ArtifactCache {
            dir,
            engine_key: format!("{:016x}", h.finish()),
            max_bytes,
        }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, sha256: &str) -> PathBuf {
        self.dir.join(format!("{sha256}-{}.cwasm", self.engine_key))
    }

    /// The compiled component for `sha256`, if a valid entry exists.
    pub(crate) fn get(
        &self,
        engine: &wasmtime::Engine,
        sha256: &str,
    ) -> Option<wasmtime::component::Component> {
        let path = self.path(sha256);
        let bytes = std::fs::read(&path).ok()?;
        let sidecar = std::fs::read_to_string(path.with_extension("cwasm.sha256")).ok()?;
        let actual = hex::encode(Sha256::digest(&bytes));
        if actual != sidecar.trim() {
            tracing::warn!(path = %path.display(), "compiled-module cache entry does not match its checksum; recompiling");
            return None;
        }
        // SAFETY: `deserialize` trusts that the bytes were produced by `Component::serialize` of
        // a compatible engine. They were: the entry is in the host's own cache directory, named
        // by this engine's fingerprint, and its checksum matches the one written next to it when
        // this host serialized it. wasmtime also checks the engine compatibility header.
        #[allow(unsafe_code)]
        let component = unsafe { wasmtime::component::Component::deserialize(engine, &bytes) };
        match component {
            Ok(c) => {
                // Recently used: evicted last. A failure only makes eviction less exact.
                if let Ok(file) = std::fs::File::options().append(true).open(&path) {
                    let _ = file.set_modified(std::time::SystemTime::now());
                }
                Some(c)
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "compiled-module cache entry is not usable; recompiling");
                None
            }
        }
    }

    /// Stores the compiled `component` for `sha256`.
    ///
    /// # Errors
    /// The I/O error, if the entry cannot be written.
    pub(crate) fn put(
        &self,
        sha256: &str,
        component: &wasmtime::component::Component,
    ) -> std::io::Result<()> {
        let bytes = component.serialize().map_err(std::io::Error::other)?;
        std::fs::create_dir_all(&self.dir)?;
        let path = self.path(sha256);
        let tmp = self
            .dir
            .join(format!(".{sha256}.{}.tmp", std::process::id()));
        std::fs::write(&tmp, &bytes)?;
        std::fs::write(
            path.with_extension("cwasm.sha256"),
            hex::encode(Sha256::digest(&bytes)),
        )?;
        std::fs::rename(&tmp, &path)?;
        self.evict(&path);
        Ok(())
    }

    /// Deletes the least recently used entries (not `keep`) until the cache fits its bound.
    fn evict(&self, keep: &Path) {
        let Ok(dir) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let mut entries: Vec<(std::time::SystemTime, u64, PathBuf)> = dir
            .filter_map(Result::ok)
            .filter(|e| e.path().extension().is_some_and(|x| x == "cwasm"))
            .filter_map(|e| {
                let meta = e.metadata().ok()?;
                Some((meta.modified().ok()?, meta.len(), e.path()))
            })
            .collect();
        let mut total: u64 = entries.iter().map(|(_, len, _)| len).sum();
        entries.sort();
        for (_, len, path) in entries {
            if total <= self.max_bytes {
                break;
            }
            if path == keep {
                continue;
            }
            match std::fs::remove_file(&path) {
                Ok(()) => {
                    let _ = std::fs::remove_file(path.with_extension("cwasm.sha256"));
                    total = total.saturating_sub(len);
                    tracing::info!(path = %path.display(), bytes = len, "evicted from the compiled-module cache (least recently used)");
                }
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "cannot evict from the compiled-module cache")
                }
            }
        }
    }

    /// The bytes of every entry now in the cache.
    pub fn size_bytes(&self) -> u64 {
        std::fs::read_dir(&self.dir)
            .map(|d| {
                d.filter_map(Result::ok)
                    .filter(|e| e.path().extension().is_some_and(|x| x == "cwasm"))
                    .filter_map(|e| e.metadata().ok())
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0)
    }
}
