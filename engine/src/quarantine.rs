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
//!   compile's [`Marker`], unwinding included), and neither does a process that exits by choice
//!   while compiles run (a graceful shutdown during a background compile): [`exiting`] deletes
//!   the markers of the compiles still under way. Only a dead process leaves one.
//! - After `after` consecutive crashes during compiles of one digest the digest is refused
//!   before anything is compiled, with the markers' paths: deleting them (or pushing another
//!   module) clears it.
//! - Markers are tiny (a decimal count) and at most [`MAX_MARKERS`]: the oldest beyond that are
//!   deleted; they count in the cache's bound like every file of its directory.
//! - Without a cache directory, or with `after` 0, nothing is written and nothing refused.
//! - A compile under way holds an exclusive lock on its marker (`flock`), which the kernel
//!   releases when its process dies: a marker whose lock is held is a compile under way (in
//!   this process or another sharing the directory), never counted as a crash, and a compile
//!   that finds the marker of its digest and tier locked runs without one of its own.
//!
//! # Caveats
//! - On a file system without working locks (some network file systems), a marker that
//!   cannot be locked is counted as before: hosts sharing such a directory could count each
//!   other's compiles under way as crashes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use crate::error::LoadError;

/// The default number of consecutive crashes during compiles of one digest after which it is
/// refused.
pub const DEFAULT_QUARANTINE_AFTER: u32 = 2;

/// The most markers kept (each names one digest and tier whose compile never ended).
pub const MAX_MARKERS: usize = 64;

/// The extension of a marker.
const EXTENSION: &str = "compiling";

/// The markers of one process's compiles under way ([`PROCESS`]; tests make their own): whoever
/// takes a path out of it (the compile's end, or [`exiting`]) deletes that marker, so each is
/// deleted once, and never after another process made a new one at the same path.
#[derive(Debug)]
pub(crate) struct Live {
    markers: Mutex<Option<HashMap<u64, PathBuf>>>,
    next: AtomicU64,
    /// Set by [`Live::exit`]: compiles that begin afterwards run unmarked.
    exiting: AtomicBool,
}

/// This process's compiles under way.
static PROCESS: Live = Live::new();

impl Live {
    const fn new() -> Live {
        Live {
            markers: Mutex::new(None),
            next: AtomicU64::new(1),
            exiting: AtomicBool::new(false),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut HashMap<u64, PathBuf>) -> T) -> T {
        let mut guard = self.markers.lock().unwrap_or_else(PoisonError::into_inner);
        f(guard.get_or_insert_with(HashMap::new))
    }

    fn exit(&self) {
        self.exiting.store(true, Ordering::SeqCst);
        self.with(|m| {
            for (_, path) in m.drain() {
                let _ = std::fs::remove_file(path);
            }
        });
    }
}

/// A compile under way: its marker, locked while it lives, is deleted when this is dropped.
#[derive(Debug)]
pub(crate) struct Marker {
    /// Where it is registered, and its key there (None: no marker).
    live: Option<(&'static Live, u64)>,
    /// The marker, open and locked (the lock goes with the process).
    file: Option<std::fs::File>,
}

impl Drop for Marker {
    fn drop(&mut self) {
        if let Some((live, id)) = self.live.take() {
            // Deleted under the registry's lock, so `exiting` never deletes it a second time.
            live.with(|m| m.remove(&id).map(std::fs::remove_file));
        }
        // Unlocked once deleted: nobody sees a finished compile's marker unlocked.
        self.file.take();
    }
}

impl Marker {
    const NONE: Marker = Marker {
        live: None,
        file: None,
    };

    /// A marker registered in `markers`, `live`'s map, whose lock the caller holds.
    fn new(
        live: &'static Live,
        markers: &mut HashMap<u64, PathBuf>,
        path: PathBuf,
        file: std::fs::File,
    ) -> Marker {
        let id = live.next.fetch_add(1, Ordering::Relaxed);
        markers.insert(id, path);
        Marker {
            live: Some((live, id)),
            file: Some(file),
        }
    }

    /// What a process killed during the compile leaves: the marker, unlocked.
    #[cfg(test)]
    fn crash(mut self) {
        if let Some((live, id)) = self.live.take() {
            live.with(|m| m.remove(&id));
        }
    }
}

/// The process is exiting by choice (a graceful shutdown, a command's end): deletes the
/// markers of its compiles still under way, which will never end but did not crash, and runs
/// any compile that begins afterwards without a marker. Call it last, just before the process
/// exits; compiles go on meanwhile (their ends delete nothing more).
///
/// # Caveats
/// - A compile that would have killed the process in the moments between this call and the
///   exit is not counted.
pub fn exiting() {
    PROCESS.exit();
}

/// Whether a live compile holds `path`'s lock.
fn held(path: &Path) -> bool {
    let Ok(file) = std::fs::File::open(path) else {
        return false;
    };
    matches!(file.try_lock(), Err(std::fs::TryLockError::WouldBlock))
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
        .filter(|p| !held(p))
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
    begin_in(&PROCESS, entry, after)
}

/// [`begin`], registered in `live`.
fn begin_in(live: &'static Live, entry: &Path, after: u32) -> Marker {
    if after == 0 {
        return Marker::NONE;
    }
    let path = marker_path(entry);
    if let Some(dir) = path.parent() {
        bound(dir);
    }
    // Written and registered under the registry's lock, `exiting` checked there too: an exit
    // (which sets `exiting`, then deletes what is registered under the lock) either finds the
    // marker registered or comes before it is written. Checked, written, then registered, a
    // marker written while a Ctrl-C's exit ran was left behind (the e2e test of Ctrl-C during
    // `wasmop inspect` saw one in a loaded run).
    live.with(|markers| {
        if live.exiting.load(Ordering::SeqCst) {
            return Marker::NONE;
        }
        match lock_marker(&path) {
            Ok(Some(file)) => Marker::new(live, markers, path, file),
            // Another compile of this digest and tier is under way: its marker stands for both.
            Ok(None) => Marker::NONE,
            Err(e) => {
                tracing::warn!(target: "wasmop::engine::quarantine", path = %path.display(), error = %e, "cannot mark the compile as under way; a crash during it will not count towards quarantine");
                Marker::NONE
            }
        }
    })
}

/// Opens and locks the marker at `path`, writing one crash more than it recorded (a marker
/// left unlocked is a dead compile's). None when a live compile holds it.
fn lock_marker(path: &Path) -> std::io::Result<Option<std::fs::File>> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut options = std::fs::File::options();
    options.read(true).write(true).create(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => return Ok(None),
        // No working locks here: counted as before (see the caveats).
        Err(std::fs::TryLockError::Error(e)) => {
            tracing::debug!(target: "wasmop::engine::quarantine", error = %e, "markers cannot be locked here");
        }
    }
    let crashes = match file.metadata()?.len() {
        0 => 0,
        _ => crashes_in(path),
    };
    file.set_len(0)?;
    std::io::Write::write_all(&mut file, crashes.saturating_add(1).to_string().as_bytes())?;
    Ok(Some(file))
}

#[cfg(test)]
fn write_marker(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    std::fs::write(path, bytes)
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
        begin(&entry(dir.path(), &sha, "fast"), 2).crash();
        assert!(
            check(dir.path(), &sha, 2).is_ok(),
            "one crash is not enough"
        );
        // The next start compiles it again, and dies again.
        begin(&entry(dir.path(), &sha, "fast"), 2).crash();
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

    /// The demo's and a rolling restart's case: the process exits by choice while a compile
    /// runs (a background optimizing compile at SIGTERM). Not a crash: nothing is left.
    #[test]
    fn a_process_that_exits_by_choice_during_a_compile_leaves_no_crash() {
        let live: &'static Live = Box::leak(Box::new(Live::new()));
        let dir = tempfile::tempdir().expect("a temporary directory");
        let (sha, crashed) = ("ab".repeat(32), "cd".repeat(32));
        begin_in(live, &entry(dir.path(), &crashed, "fast"), 2).crash();
        let under_way = begin_in(live, &entry(dir.path(), &sha, "optimized"), 2);
        live.exit();
        assert!(
            markers_of(dir.path(), &sha).is_empty(),
            "the exit deleted the marker of the compile under way"
        );
        assert_eq!(
            markers_of(dir.path(), &crashed).len(),
            1,
            "a dead compile's marker stays counted"
        );
        // Another host sharing the directory marks the same compile; this process's compile
        // then ends (before the exit completes): the other's marker stays.
        let elsewhere = begin(&entry(dir.path(), &sha, "optimized"), 2);
        drop(under_way);
        assert!(marker_path(&entry(dir.path(), &sha, "optimized")).exists());
        drop(elsewhere);
        // A compile that begins after the exit began runs unmarked.
        begin_in(live, &entry(dir.path(), &sha, "fast"), 2).crash();
        assert!(markers_of(dir.path(), &sha).is_empty());
    }

    #[test]
    fn crashes_count_per_tier_and_the_worst_tier_decides() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let sha = "ab".repeat(32);
        // One crash with both tiers compiling: one crash, not two.
        begin(&entry(dir.path(), &sha, "fast"), 2).crash();
        begin(&entry(dir.path(), &sha, "optimized"), 2).crash();
        assert!(check(dir.path(), &sha, 2).is_ok());
        // The optimized compile dies again: quarantined.
        begin(&entry(dir.path(), &sha, "optimized"), 2).crash();
        assert!(check(dir.path(), &sha, 2).is_err());
    }

    /// Hosts sharing one cache directory: a compile under way in another process (here
    /// another open of the marker, which `flock` treats the same) is not a crash.
    #[test]
    fn a_compile_under_way_elsewhere_is_not_a_crash() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let sha = "ab".repeat(32);
        begin(&entry(dir.path(), &sha, "fast"), 2).crash();
        let under_way = begin(&entry(dir.path(), &sha, "fast"), 2);
        let beside = begin(&entry(dir.path(), &sha, "fast"), 2);
        assert!(
            check(dir.path(), &sha, 2).is_ok(),
            "one crash, and two compiles under way"
        );
        drop(beside);
        assert!(
            markers_of(dir.path(), &sha).is_empty() && check(dir.path(), &sha, 2).is_ok(),
            "the compile beside left the live marker alone"
        );
        under_way.crash();
        assert!(
            check(dir.path(), &sha, 2).is_err(),
            "then it died: 2 crashes"
        );
    }

    #[test]
    fn markers_are_bounded_in_count_and_bytes() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        for i in 0..MAX_MARKERS + 10 {
            let sha = format!("{i:064x}");
            (begin(&entry(dir.path(), &sha, "fast"), 2).crash());
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
