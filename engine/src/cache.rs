//! The on-disk cache of compiled modules, so a restart or a re-push skips compilation.
//!
//! Entries are keyed by the module's sha256 and a fingerprint of the engine (wasmtime version,
//! every compilation setting and the tier: fast or optimized),
//! `<dir>/<module-sha256>-<engine>.cwasm`, with a sidecar `.sha256` of the artifact itself.
//!
//! The directory is bounded, counting every file in it (entries, their sidecars, temporary files
//! of writes under way, anything else): before a write, the least recently used entries (by
//! modification time, which a hit refreshes) are deleted until the new entry fits; an entry that
//! cannot fit is not written (the module still loads, compiled). Temporary files older than
//! [`STALE_TEMPORARY`] (left by a host that died while writing) are deleted when the cache is
//! opened and whenever it is listed.
//!
//! An entry is mapped, not copied, when it can be (Linux, a regular file owned by this process's
//! user and writable by no one else): the compiled code and the modules' initial memory images
//! are then file-backed pages, resident only where touched and reclaimable by the kernel, instead
//! of an anonymous copy of the whole artifact per module (docs/benchmarks.md, "Idle host
//! memory"). Otherwise the entry is read into memory, as before.
//!
//! # Guarantees
//! - Writes are atomic (temp file + rename): a crash never leaves a half-written entry in place,
//!   and an entry's inode is never written again once it has its name, so a mapped entry never
//!   changes under the host because of the host (or another wasmop sharing the directory).
//! - Entries and sidecars are created readable and writable by their owner only (`0600`).
//! - An entry is only deserialized if its own checksum matches the sidecar; a corrupt, truncated
//!   or foreign entry is a miss (logged), never undefined behaviour from our side. A mapped entry
//!   is checked through the same open file that is then mapped (`/proc/self/fd`), so the bytes
//!   checked are the inode mapped; only its owner (this user) or root could change them
//!   afterwards, and they can already change the running process itself.
//! - Cache failures never fail a load: the module is compiled instead.
//!
//! The checksum guards against accidents (a disk error, a truncated copy), not against someone
//! who can write the directory: they can write an entry and its sidecar alike, and so run code in
//! the host. The directory must be writable by the host's user only (docs/operating.md, "Threat
//! model").

use std::hash::{Hash, Hasher};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use wasmtime::component::Component;

use sha2::{Digest, Sha256};

/// The default bound of the compiled-module cache: a few dozen Rust modules or a few Python ones
/// (an optimized Python artifact is ~60 MB). Three quarters of `deploy/`'s 1 GiB cache volume,
/// so a volume at its bound still has room for what the kubelet counts and the host does not.
pub const DEFAULT_CACHE_MAX_BYTES: u64 = 768 << 20;

/// A temporary file this old was left by a host that died while writing it (a write takes
/// seconds).
pub const STALE_TEMPORARY: std::time::Duration = std::time::Duration::from_secs(600);

/// The bytes of an entry's sidecar (a hex sha256).
const SIDECAR_BYTES: u64 = 64;

/// What the directory holds: the bytes of every file, and the entries that may be evicted
/// (modification time, bytes, path).
#[derive(Debug, Default)]
struct Listing {
    total: u64,
    entries: Vec<(std::time::SystemTime, u64, PathBuf)>,
}

/// A directory of compiled artifacts.
#[derive(Debug, Clone)]
pub struct ArtifactCache {
    dir: PathBuf,
    engine_key: String,
    max_bytes: u64,
    /// Consecutive crashes during compiles of one digest that quarantine it (0: never; see
    /// [`crate::quarantine`]).
    quarantine_after: u32,
}

impl ArtifactCache {
    /// A cache in `dir` for artifacts of `engine` compiled at `tier` (`fast`, `optimized`),
    /// holding at most `max_bytes` of entries (all tiers together).
    pub(crate) fn new(dir: PathBuf, engine: &wasmtime::Engine, tier: &str, max_bytes: u64) -> Self {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        env!("CARGO_PKG_VERSION").hash(&mut h);
        engine.precompile_compatibility_hash().hash(&mut h);
        tier.hash(&mut h);
        let cache = ArtifactCache {
            dir,
            engine_key: format!("{:016x}", h.finish()),
            max_bytes,
            quarantine_after: crate::quarantine::DEFAULT_QUARANTINE_AFTER,
        };
        // Deletes what a host that died while writing left behind.
        cache.list();
        cache
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Sets the consecutive crashes during compiles of one digest that quarantine it (0: never).
    pub(crate) fn with_quarantine_after(mut self, after: u32) -> Self {
        self.quarantine_after = after;
        self
    }

    /// Refuses `sha256` if it is quarantined ([`crate::quarantine::check`]).
    ///
    /// # Errors
    /// [`crate::LoadError::Quarantined`].
    pub(crate) fn check_quarantine(&self, sha256: &str) -> Result<(), crate::LoadError> {
        crate::quarantine::check(&self.dir, sha256, self.quarantine_after)
    }

    /// Marks a compile of `sha256` for this cache's tier as under way until the marker is
    /// dropped ([`crate::quarantine::begin`]).
    pub(crate) fn compiling(&self, sha256: &str) -> crate::quarantine::Marker {
        crate::quarantine::begin(&self.path(sha256), self.quarantine_after)
    }

    fn path(&self, sha256: &str) -> PathBuf {
        self.dir.join(format!("{sha256}-{}.cwasm", self.engine_key))
    }

    /// The compiled component for `sha256`, if a valid entry exists; mapped from its file when
    /// [`mappable`] allows it, read into memory otherwise.
    pub(crate) fn get(&self, engine: &wasmtime::Engine, sha256: &str) -> Option<Component> {
        let path = self.path(sha256);
        let sidecar = std::fs::read_to_string(path.with_extension("cwasm.sha256")).ok()?;
        let mut file = std::fs::File::open(&path).ok()?;
        let map = mappable(&file);
        let (actual, bytes) = if map {
            (sha256_of_file(&mut file).ok()?, None)
        } else {
            let mut bytes = Vec::new();
            file.read_to_end(&mut bytes).ok()?;
            (hex::encode(Sha256::digest(&bytes)), Some(bytes))
        };
        if actual != sidecar.trim() {
            tracing::warn!(target: "wasmop::engine::cache", path = %path.display(), "compiled-module cache entry does not match its checksum; recompiling");
            return None;
        }
        let component = match bytes {
            Some(bytes) => deserialize_bytes(engine, &bytes),
            None => deserialize_mapped(engine, &file).or_else(|e| {
                tracing::debug!(target: "wasmop::engine::cache", path = %path.display(), error = %e, "cannot map the compiled-module cache entry; reading it into memory");
                copy_checked(engine, &mut file, sidecar.trim())
            }),
        };
        match component {
            Ok(c) => {
                // Recently used: evicted last. A failure only makes eviction less exact.
                if let Ok(file) = std::fs::File::options().append(true).open(&path) {
                    let _ = file.set_modified(std::time::SystemTime::now());
                }
                Some(c)
            }
            Err(e) => {
                tracing::warn!(target: "wasmop::engine::cache", path = %path.display(), error = %e, "compiled-module cache entry is not usable; recompiling");
                None
            }
        }
    }

    /// Stores the compiled `component` for `sha256`.
    ///
    /// # Errors
    /// The I/O error, if the entry cannot be written.
    pub(crate) fn put(&self, sha256: &str, component: &Component) -> std::io::Result<()> {
        let bytes = component.serialize().map_err(std::io::Error::other)?;
        self.put_artifact(sha256, &bytes)
    }

    /// Stores `artifact` (the output of `Engine::precompile_component` for this cache's engine)
    /// for `sha256`.
    ///
    /// # Errors
    /// The I/O error, if the entry cannot be written.
    /// An artifact that cannot fit the bound, even with every other entry evicted, is not written
    /// (an error).
    pub(crate) fn put_artifact(&self, sha256: &str, artifact: &[u8]) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let need = u64::try_from(artifact.len())
            .unwrap_or(u64::MAX)
            .saturating_add(SIDECAR_BYTES);
        if !self.evict(None, need) {
            return Err(std::io::Error::other(format!(
                "no room for {need} bytes in the compiled-module cache (bound {} bytes, counting every file in {})",
                self.max_bytes,
                self.dir.display()
            )));
        }
        let path = self.path(sha256);
        // A name no other writer uses, created new: hosts sharing the directory (each maybe
        // pid 1 in its container) never write one inode together, so an inode renamed into
        // place, and perhaps mapped, is never written again.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let tmp = self
            .dir
            .join(format!(".{sha256}.{}.{nanos}.tmp", std::process::id()));
        let written = write_private(&tmp, artifact, true)
            .and_then(|()| {
                write_private(
                    &path.with_extension("cwasm.sha256"),
                    hex::encode(Sha256::digest(artifact)).as_bytes(),
                    false,
                )
            })
            .and_then(|()| std::fs::rename(&tmp, &path));
        if let Err(e) = written {
            // A half-written temporary file is not left behind (its name is unique).
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        // Another host sharing the directory may have written meanwhile.
        self.evict(Some(&path), 0);
        Ok(())
    }

    /// Deletes the entry for `sha256`, if any (a component that compiled but cannot serve).
    pub(crate) fn remove(&self, sha256: &str) {
        let path = self.path(sha256);
        let _ = std::fs::remove_file(&path);
        let _ = std::fs::remove_file(path.with_extension("cwasm.sha256"));
    }

    /// Every file in the directory, deleting stale temporary files on the way.
    fn list(&self) -> Listing {
        let mut listing = Listing::default();
        let Ok(dir) = std::fs::read_dir(&self.dir) else {
            return listing;
        };
        for entry in dir.filter_map(Result::ok) {
            let (path, Ok(meta)) = (entry.path(), entry.metadata()) else {
                continue;
            };
            if !meta.is_file() {
                continue;
            }
            if stale_temporary(&path, &meta) && std::fs::remove_file(&path).is_ok() {
                tracing::info!(target: "wasmop::engine::cache", path = %path.display(), bytes = meta.len(), "deleted a stale temporary file from the compiled-module cache");
                continue;
            }
            listing.total = listing.total.saturating_add(meta.len());
            if path.extension().is_some_and(|x| x == "cwasm")
                && let Ok(modified) = meta.modified()
            {
                listing.entries.push((modified, meta.len(), path));
            }
        }
        listing
    }

    /// Deletes the least recently used entries (never `keep`) until every file in the directory
    /// and `room` more bytes fit the bound; returns whether they do.
    fn evict(&self, keep: Option<&Path>, room: u64) -> bool {
        let Listing {
            mut total,
            mut entries,
        } = self.list();
        entries.sort();
        for (_, len, path) in entries {
            if total.saturating_add(room) <= self.max_bytes {
                break;
            }
            if Some(path.as_path()) == keep {
                continue;
            }
            let sidecar = path.with_extension("cwasm.sha256");
            let sidecar_len = std::fs::metadata(&sidecar).map_or(0, |m| m.len());
            match std::fs::remove_file(&path) {
                Ok(()) => {
                    let gone = std::fs::remove_file(&sidecar).map_or(0, |()| sidecar_len);
                    total = total.saturating_sub(len.saturating_add(gone));
                    tracing::info!(target: "wasmop::engine::cache", path = %path.display(), bytes = len, "evicted from the compiled-module cache (least recently used)");
                }
                Err(e) => {
                    tracing::warn!(target: "wasmop::engine::cache", path = %path.display(), error = %e, "cannot evict from the compiled-module cache")
                }
            }
        }
        total.saturating_add(room) <= self.max_bytes
    }

    /// The bytes of every file now in the cache's directory (what its volume counts).
    pub fn size_bytes(&self) -> u64 {
        self.list().total
    }
}

/// Whether `path` is a temporary file of a write older than [`STALE_TEMPORARY`].
fn stale_temporary(path: &Path, meta: &std::fs::Metadata) -> bool {
    path.extension().is_some_and(|x| x == "tmp")
        && meta
            .modified()
            .ok()
            .and_then(|m| m.elapsed().ok())
            .is_some_and(|age| age > STALE_TEMPORARY)
}

/// Writes `bytes` to a file at `path`, readable and writable by its owner only (the mode of a new
/// file; an existing one keeps its mode). With `new`, the file must not exist yet (entries are
/// only ever new files: temporary names, then renamed); without, an existing one is truncated.
fn write_private(path: &Path, bytes: &[u8], new: bool) -> std::io::Result<()> {
    let mut options = std::fs::File::options();
    if new {
        options.write(true).create_new(true);
    } else {
        options.write(true).create(true).truncate(true);
    }
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)?.write_all(bytes)
}

/// The sha256 of what `file` holds, read through the file itself in small pieces (so checking a
/// mapped entry copies nothing into the heap).
fn sha256_of_file(file: &mut std::fs::File) -> std::io::Result<String> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match file.read(&mut buf)? {
            0 => return Ok(hex::encode(hasher.finalize())),
            n => hasher.update(&buf[..n]),
        }
    }
}

/// Whether the entry open as `file` may be mapped in place: Linux (where `/proc/self/fd` reopens
/// the very inode checked), a regular file, owned by this process's user and writable by no
/// other. Anything else is read into memory and checked there.
#[cfg(target_os = "linux")]
fn mappable(file: &std::fs::File) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = file.metadata() else {
        return false;
    };
    // SAFETY: `geteuid` has no preconditions and cannot fail.
    #[allow(unsafe_code)]
    let euid = unsafe { libc::geteuid() };
    meta.is_file() && meta.uid() == euid && meta.mode() & 0o022 == 0
}

#[cfg(not(target_os = "linux"))]
fn mappable(_file: &std::fs::File) -> bool {
    false
}

/// Reads the entry open as `file` again, from its start, into memory, checks it against
/// `expected` and loads it.
fn copy_checked(
    engine: &wasmtime::Engine,
    file: &mut std::fs::File,
    expected: &str,
) -> wasmtime::Result<Component> {
    use std::io::Seek;
    let mut bytes = Vec::new();
    file.seek(std::io::SeekFrom::Start(0))?;
    file.read_to_end(&mut bytes)?;
    if hex::encode(Sha256::digest(&bytes)) != expected {
        wasmtime::bail!("the entry changed after its checksum was verified");
    }
    deserialize_bytes(engine, &bytes)
}

/// Loads a checked entry's bytes (a copy in memory).
fn deserialize_bytes(engine: &wasmtime::Engine, bytes: &[u8]) -> wasmtime::Result<Component> {
    // SAFETY: `deserialize` trusts that the bytes were produced by `Component::serialize` of
    // a compatible engine. They were: the entry is in the host's own cache directory, named
    // by this engine's fingerprint, and its checksum matches the one written next to it when
    // this host serialized it. wasmtime also checks the engine compatibility header.
    #[allow(unsafe_code)]
    unsafe {
        Component::deserialize(engine, bytes)
    }
}

/// Maps a checked entry, open as `file`, in place.
#[cfg(target_os = "linux")]
fn deserialize_mapped(
    engine: &wasmtime::Engine,
    file: &std::fs::File,
) -> wasmtime::Result<Component> {
    use std::os::fd::AsRawFd;
    // Opening the fd's `/proc` link opens the inode `file` is, whatever the directory now holds
    // under the entry's name.
    let same_inode = format!("/proc/self/fd/{}", file.as_raw_fd());
    // SAFETY: as `deserialize_bytes`, and `deserialize_file` further trusts that the file is not
    // changed while mapped. The bytes mapped are the inode whose checksum was just verified
    // through this same open file; the cache never writes an inode after renaming it into
    // place, and `mappable` checked that only this process's user (or root) could: someone
    // who can already change the running process.
    #[allow(unsafe_code)]
    unsafe {
        Component::deserialize_file(engine, &same_inode)
    }
}

#[cfg(not(target_os = "linux"))]
fn deserialize_mapped(
    _engine: &wasmtime::Engine,
    _file: &std::fs::File,
) -> wasmtime::Result<Component> {
    Err(wasmtime::format_err!(
        "mapping compiled artifacts is only done on Linux"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(dir: &Path, max_bytes: u64) -> ArtifactCache {
        ArtifactCache::new(
            dir.to_path_buf(),
            &wasmtime::Engine::default(),
            "fast",
            max_bytes,
        )
    }

    fn files(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .map(|d| {
                d.filter_map(Result::ok)
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }

    fn total(dir: &Path) -> u64 {
        std::fs::read_dir(dir)
            .map(|d| {
                d.filter_map(Result::ok)
                    .filter_map(|e| e.metadata().ok())
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0)
    }

    #[test]
    fn every_file_counts_and_room_is_made_before_a_write() {
        let dir = tempfile::tempdir().expect("tempdir");
        // A write of another host under way, and something else on the volume.
        std::fs::write(dir.path().join(".other.1.2.tmp"), vec![0u8; 300_000]).expect("write");
        std::fs::write(dir.path().join("notes"), vec![0u8; 100_000]).expect("write");
        let c = cache(dir.path(), 800_000);
        c.put_artifact("a", &[1u8; 250_000]).expect("fits");
        c.put_artifact("b", &[2u8; 250_000])
            .expect("fits after evicting a");
        assert!(total(dir.path()) <= 800_000, "{:?}", files(dir.path()));
        assert_eq!(c.size_bytes(), total(dir.path()));
        let names = files(dir.path());
        assert!(!names.iter().any(|n| n.starts_with("a-")), "{names:?}");
        assert!(names.iter().any(|n| n.starts_with("b-")), "{names:?}");
        // Larger than the room left with every entry gone: not written, nothing else lost.
        let refused = c.put_artifact("c", &[3u8; 700_000]);
        assert!(refused.is_err(), "{names:?}");
        assert!(!files(dir.path()).iter().any(|n| n.starts_with("c-")));
        assert!(total(dir.path()) <= 800_000);
    }

    #[test]
    fn stale_temporary_files_are_deleted_when_the_cache_opens() {
        let dir = tempfile::tempdir().expect("tempdir");
        let stale = dir.path().join(".dead.1.2.tmp");
        let fresh = dir.path().join(".live.1.3.tmp");
        std::fs::write(&stale, vec![0u8; 1000]).expect("write");
        std::fs::write(&fresh, vec![0u8; 1000]).expect("write");
        let old =
            std::time::SystemTime::now() - STALE_TEMPORARY - std::time::Duration::from_secs(60);
        std::fs::File::options()
            .write(true)
            .open(&stale)
            .and_then(|f| f.set_modified(old))
            .expect("set mtime");
        let c = cache(dir.path(), 1 << 20);
        assert!(!stale.exists(), "the stale temporary file stays");
        assert!(fresh.exists(), "a write under way lost its file");
        assert_eq!(c.size_bytes(), 1000);
    }
}
