//! The on-disk cache of compiled modules, so a restart or a re-push skips compilation.
//!
//! Entries are keyed by the module's sha256 and a fingerprint of the engine (wasmtime version
//! and every compilation setting), `<dir>/<module-sha256>-<engine>.cwasm`, with a sidecar
//! `.sha256` of the artifact itself.
//!
//! # Guarantees
//! - Writes are atomic (temp file + rename): a crash never leaves a half-written entry in place.
//! - An entry is only deserialized if its own checksum matches the sidecar; a corrupt, truncated
//!   or foreign entry is a miss (logged), never undefined behaviour from our side.
//! - Cache failures never fail a load: the module is compiled instead.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// A directory of compiled artifacts.
#[derive(Debug, Clone)]
pub struct ArtifactCache {
    dir: PathBuf,
    engine_key: String,
}

impl ArtifactCache {
    /// A cache in `dir` for artifacts of `engine`.
    pub(crate) fn new(dir: PathBuf, engine: &wasmtime::Engine) -> Self {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        env!("CARGO_PKG_VERSION").hash(&mut h);
        engine.precompile_compatibility_hash().hash(&mut h);
        ArtifactCache {
            dir,
            engine_key: format!("{:016x}", h.finish()),
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
            Ok(c) => Some(c),
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
        std::fs::rename(&tmp, &path)
    }
}
