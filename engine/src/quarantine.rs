//! Quarantine of a module whose compile killed the host: a marker file in the compiled-cache
//! directory says a compile of a digest is under way, so a crash during it (an OOM kill, a
//! compiler crash, SIGKILL) leaves the marker behind, and the next start counts it.
//!
//! Before compiling module `D` at a tier, the engine writes `<D>-<engine>.compiling` (the
//! cache's name for that tier's entry, see [`crate::cache::ArtifactCache`]) holding the number
//! of compiles of `D` at that tier that started and never ended, this one included; the marker
//! is deleted when the compile ends, compiled or refused. A load of `D` is refused
//! ([`LoadError::Quarantined`]) once a marker of `D` (any tier) counts `after` such crashes.
//!
//! # Guarantees
//! - A compile that ends, well or badly, leaves no marker (the marker is dropped with the
//!   compile's [`Marker`], unwinding included): only a dead process leaves one.
//! - After `after` consecutive crashes during compiles of one digest the digest is refused
//!   before anything is compiled, with the markers' paths: deleting them (or pushing another
//!   module) clears it.
//! - Markers are tiny (a decimal count) and at most [`MAX_MARKERS`]: the oldest beyond that are
//!   deleted; they count in the cache's bound like every file of its directory.
//! - Without a cache directory, or with `after` 0, nothing is written and nothing refused.
//!
//! # Caveats
//! - Hosts sharing one cache directory (not `deploy/`'s layout: each pod has its own volume)
//!   could count each other's compiles under way as crashes.

use std::path::{Path, PathBuf};

use crate::error::LoadError;

/// The default number of consecutive crashes during compiles of one digest after which it is
/// refused.
pub const DEFAULT_QUARANTINE_AFTER: u32 = 2;

/// The most markers kept (each names one digest and tier whose compile never ended).
pub const MAX_MARKERS: usize = 64;

/// The extension of a marker.
const EXTENSION: &str = "compiling";

/// A compile under way: its marker is deleted when this is dropped.
#[derive(Debug)]
pub(crate) struct Marker {
    path: Option<PathBuf>,
}

impl Drop for Marker {
    fn drop(&mut self) {
        if let Some(path) = self.path.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// The marker of the compile whose cache entry is `entry` (`<dir>/<sha256>-<engine>.cwasm`).
fn marker_path(entry: &Path) -> PathBuf {
    entry.with_extension(EXTENSION)
}

/// The markers of `sha256` in `dir` (every tier), with the crashes each counts.
fn markers_of(dir: &Path, sha256: &str) -> Vec<(PathBuf, u32)> {
    let Ok(read) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    read.filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| is_marker(p) && name_of(p).starts_with(&format!("{sha256}-")))
        .map(|p| {
            let crashes = crashes_in(&p);
            (p, crashes)
        })
        .collect()
}

fn name_of(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn is_marker(path: &Path) -> bool {
    path.extension().is_some_and(|x| x == EXTENSION)
}

/// The crashes a marker counts: at least 1 (it exists), whatever it holds.
fn crashes_in(path: &Path) -> u32 {
    let mut text = String::new();
    let read = std::fs::File::open(path)
        .and_then(|f| std::io::Read::read_to_string(&mut std::io::Read::take(f, 16), &mut text));
    read.ok()
        .and_then(|_| text.trim().parse::<u32>().ok())
        .unwrap_or(1)
        .max(1)
}

/// Refuses `sha256` when one of its markers in `dir` counts `after` crashes or more (`after` 0:
/// never).
///
/// # Errors
/// [`LoadError::Quarantined`], naming the markers to delete.
pub(crate) fn check(dir: &Path, sha256: &str, after: u32) -> Result<(), LoadError> {
    if after == 0 {
        return Ok(());
    }
    let markers = markers_of(dir, sha256);
    let crashes = markers.iter().map(|(_, c)| *c).max().unwrap_or(0);
    if crashes < after {
        return Ok(());
    }
    let paths: Vec<String> = markers
        .iter()
        .map(|(p, _)| p.display().to_string())
        .collect();
    Err(LoadError::Quarantined {
        sha256: sha256.to_string(),
        crashes,
        markers: paths.join(" "),
    })
}

/// Marks the compile whose cache entry is `entry` as under way (`after` 0: nothing is written).
/// The count it writes is one more than the marker left there, if any; a marker that cannot be
/// written is logged, never fatal (the compile runs unguarded).
pub(crate) fn begin(entry: &Path, after: u32) -> Marker {
    if after == 0 {
        return Marker { path: None };
    }
    let path = marker_path(entry);
    let crashes = if path.exists() { crashes_in(&path) } else { 0 };
    if let Some(dir) = path.parent() {
        bound(dir);
    }
    let count = crashes.saturating_add(1).to_string();
    match write_marker(&path, count.as_bytes()) {
        Ok(()) => Marker { path: Some(path) },
        Err(e) => {
            tracing::warn!(target: "wasmop::engine::quarantine", path = %path.display(), error = %e, "cannot mark the compile as under way; a crash during it will not count towards quarantine");
            Marker { path: None }
        }
    }
}

fn write_marker(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut options = std::fs::File::options();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    std::io::Write::write_all(&mut options.open(path)?, bytes)
}

/// Deletes the oldest markers of `dir` beyond [`MAX_MARKERS`] - 1 (room for one more).
fn bound(dir: &Path) {
    let Ok(read) = std::fs::read_dir(dir) else {
        return;
    };
    let mut markers: Vec<(std::time::SystemTime, PathBuf)> = read
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| is_marker(p))
        .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
        .collect();
    if markers.len() < MAX_MARKERS {
        return;
    }
    markers.sort();
    let excess = markers.len() + 1 - MAX_MARKERS;
    for (_, path) in markers.into_iter().take(excess) {
        let _ = std::fs::remove_file(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(dir: &Path, sha: &str, tier: &str) -> PathBuf {
        dir.join(format!("{sha}-{tier}.cwasm"))
    }

    #[test]
    fn a_compile_that_ends_leaves_no_marker() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let sha = "ab".repeat(32);
        drop(begin(&entry(dir.path(), &sha, "fast"), 2));
        assert!(markers_of(dir.path(), &sha).is_empty());
        assert!(check(dir.path(), &sha, 2).is_ok());
    }

    #[test]
    fn two_crashes_during_one_digests_compile_quarantine_it_and_deleting_the_marker_clears_it() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let (sha, other) = ("ab".repeat(32), "cd".repeat(32));
        // A crash: the marker outlives the process (forgotten, as a killed process would).
        std::mem::forget(begin(&entry(dir.path(), &sha, "fast"), 2));
        assert!(
            check(dir.path(), &sha, 2).is_ok(),
            "one crash is not enough"
        );
        // The next start compiles it again, and dies again.
        std::mem::forget(begin(&entry(dir.path(), &sha, "fast"), 2));
        let Err(e) = check(dir.path(), &sha, 2) else {
            panic!("two consecutive crashes quarantine the digest")
        };
        let message = e.to_string();
        assert!(
            message.contains(&sha) && message.contains("2 times") && message.contains(".compiling"),
            "{message}"
        );
        assert!(e.is_module_fault());
        // Other digests load; `after` 0 turns quarantine off.
        assert!(check(dir.path(), &other, 2).is_ok());
        assert!(check(dir.path(), &sha, 0).is_ok());
        // Deleting the marker clears it.
        for (path, _) in markers_of(dir.path(), &sha) {
            std::fs::remove_file(path).expect("the marker is deleted");
        }
        assert!(check(dir.path(), &sha, 2).is_ok());
    }

    #[test]
    fn crashes_count_per_tier_and_the_worst_tier_decides() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let sha = "ab".repeat(32);
        // One crash with both tiers compiling: one crash, not two.
        std::mem::forget(begin(&entry(dir.path(), &sha, "fast"), 2));
        std::mem::forget(begin(&entry(dir.path(), &sha, "optimized"), 2));
        assert!(check(dir.path(), &sha, 2).is_ok());
        // The optimized compile dies again: quarantined.
        std::mem::forget(begin(&entry(dir.path(), &sha, "optimized"), 2));
        assert!(check(dir.path(), &sha, 2).is_err());
    }

    #[test]
    fn markers_are_bounded_in_count_and_bytes() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        for i in 0..MAX_MARKERS + 10 {
            let sha = format!("{i:064x}");
            std::mem::forget(begin(&entry(dir.path(), &sha, "fast"), 2));
        }
        let markers: Vec<PathBuf> = std::fs::read_dir(dir.path())
            .expect("the directory")
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| is_marker(p))
            .collect();
        assert_eq!(markers.len(), MAX_MARKERS);
        for m in &markers {
            assert!(std::fs::metadata(m).expect("a marker").len() <= 10);
        }
        // A garbled marker still counts as the crash it records.
        let garbled = entry(dir.path(), &"ef".repeat(32), "fast");
        write_marker(&marker_path(&garbled), b"\xff\xfe").expect("written");
        assert_eq!(crashes_in(&marker_path(&garbled)), 1);
    }
}
