//! Files the host writes for people (recordings, fixtures, golden files): replaced whole, never
//! rewritten in place.
//!
//! # Guarantees
//! - [`write_private`] creates a file only its owner can read or write (0600 on Unix), also
//!   when it replaces an existing one, and replaces it whole (a new file renamed over it): an
//!   interrupted write never leaves half a file, and the partial file of a killed one is
//!   deleted by a later write. [`write_whole`] does the same with an ordinary file's
//!   permissions.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, SystemTime};

/// How the partial file of a [`write_private`] is named: this, then `tempfile`'s random part.
pub const PARTIAL: &str = ".wasmop-partial-";

/// How old a partial file must be before a later write takes it for the leftover of a killed
/// one: far longer than any write of a fixture or recording takes.
pub const PARTIAL_STALE_AFTER: Duration = Duration::from_secs(600);

/// Writes `bytes` to `path`, readable and writable by its owner only, replacing any file there
/// whole: the text goes to a new file beside it (0600 on Unix from its creation, by
/// `tempfile`, named [`PARTIAL`]`*`), which is then renamed over `path`. A write interrupted
/// before the rename leaves the old file as it was, never half of the new one.
///
/// # Guarantees
/// A process killed between the two steps leaves its partial file behind; the next write into
/// the same directory deletes the partial files older than [`PARTIAL_STALE_AFTER`] (a younger
/// one may be another process's write under way), so such files are at most those of the last
/// ten minutes' kills.
///
/// # Errors
/// The file cannot be created, written or renamed over `path`.
pub fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    replace_whole(path, bytes, None)
}

/// Writes `bytes` to `path`, replacing any file there whole as [`write_private`] does, but
/// readable as an ordinary file: with the permissions of the file it replaces, or 0644 on Unix
/// for a new one (a golden file meant for commits).
///
/// # Errors
/// The file cannot be created, written, given its permissions or renamed over `path`.
pub fn write_whole(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let permissions = match std::fs::metadata(path) {
        Ok(m) => Some(m.permissions()),
        Err(_) => ordinary(),
    };
    replace_whole(path, bytes, permissions)
}

/// The permissions of a new ordinary file: 0644 on Unix (elsewhere, tempfile's).
fn ordinary() -> Option<std::fs::Permissions> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        Some(std::fs::Permissions::from_mode(0o644))
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// Writes `bytes` to a new partial file beside `path` (0600 from its creation; `permissions`
/// once written, if given) and renames it over `path`.
fn replace_whole(
    path: &Path,
    bytes: &[u8],
    permissions: Option<std::fs::Permissions>,
) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    remove_stale_partials(dir, SystemTime::now());
    let mut file = tempfile::Builder::new().prefix(PARTIAL).tempfile_in(dir)?;
    file.write_all(bytes)?;
    if let Some(permissions) = permissions {
        file.as_file().set_permissions(permissions)?;
    }
    file.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// Deletes the partial files in `dir` last modified [`PARTIAL_STALE_AFTER`] before `now` or
/// earlier. Best effort: a directory or file that cannot be read or deleted is left (and the
/// write that follows reports what matters).
fn remove_stale_partials(dir: &Path, now: SystemTime) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let partial = entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(PARTIAL));
        if !partial {
            continue;
        }
        let modified = entry.metadata().and_then(|m| m.modified());
        let stale = modified.is_ok_and(|m| {
            now.duration_since(m)
                .is_ok_and(|age| age >= PARTIAL_STALE_AFTER)
        });
        if stale {
            let path = entry.path();
            if let Err(e) = std::fs::remove_file(&path) {
                tracing::warn!(file = %path.display(), error = %e, "cannot delete the partial file of an interrupted write");
            }
        }
    }
}

/// A temporary directory for a test (kept while the first value lives) and its path.
#[cfg(test)]
pub(crate) fn temp_dir() -> (Option<tempfile::TempDir>, std::path::PathBuf) {
    let tmp = tempfile::tempdir().ok();
    let dir = tmp
        .as_ref()
        .map(|d| d.path().to_path_buf())
        .unwrap_or_default();
    (tmp, dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A write interrupted half-way (Ctrl-C during `wasmop test --from-cluster`, a host killed
    /// while recording) must not leave half a file where a whole one was: the new text goes
    /// to a file of its own that replaces the old one whole. Shown by a reader that opened the
    /// old file first: a file rewritten in place would show it the new (or a truncated) text.
    #[test]
    fn a_private_file_is_replaced_whole_not_rewritten_in_place() {
        use std::io::Read;
        let (_tmp, dir) = temp_dir();
        let path = dir.join("fixture.yaml");
        assert!(write_private(&path, b"old text").is_ok());
        let mut before = std::fs::File::open(&path).map_err(|e| e.to_string());
        assert!(write_private(&path, b"new").is_ok());
        let mut old = String::new();
        let read = before.as_mut().map(|f| f.read_to_string(&mut old));
        assert!(read.is_ok_and(|r| r.is_ok()));
        assert_eq!(old, "old text", "the old file was rewritten in place");
        assert_eq!(std::fs::read(&path).ok().as_deref(), Some(&b"new"[..]));
        let names: Vec<_> = std::fs::read_dir(&dir)
            .map(|d| d.filter_map(Result::ok).map(|e| e.file_name()).collect())
            .unwrap_or_default();
        assert_eq!(
            names,
            vec![std::ffi::OsString::from("fixture.yaml")],
            "nothing left beside it"
        );
    }

    /// A process killed between a write and its rename (a host OOM-killed while recording, a
    /// capture killed with SIGKILL) leaves its partial file behind: the next write into the
    /// same directory deletes such files once they are older than any write takes, and leaves
    /// a young one (another process's write under way) alone.
    #[test]
    fn a_partial_file_left_by_a_killed_write_is_deleted_by_the_next_write() {
        let (_tmp, dir) = temp_dir();
        let stale = dir.join(format!("{PARTIAL}stale"));
        let young = dir.join(format!("{PARTIAL}young"));
        let own = dir.join(".wasmop-config");
        for p in [&stale, &young, &own] {
            assert!(std::fs::write(p, b"half").is_ok());
        }
        let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        let aged = std::fs::File::options()
            .write(true)
            .open(&stale)
            .and_then(|f| f.set_modified(hour_ago));
        assert!(aged.is_ok());
        assert!(write_private(&dir.join("recording.yaml"), b"whole").is_ok());
        assert!(!stale.exists(), "the stale partial file is still there");
        assert!(young.exists(), "a write under way lost its file");
        assert!(own.exists());
    }

    #[cfg(unix)]
    #[test]
    fn private_files_are_0600_also_when_replacing_a_readable_one() {
        use std::os::unix::fs::PermissionsExt;
        let (_tmp, dir) = temp_dir();
        let path = dir.join("f");
        let mode = |p: &Path| std::fs::metadata(p).map(|m| m.permissions().mode() & 0o777);
        assert!(write_private(&path, b"one").is_ok());
        assert_eq!(mode(&path).ok(), Some(0o600));
        let opened = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644));
        assert!(opened.is_ok());
        assert!(write_private(&path, b"two").is_ok());
        assert_eq!(mode(&path).ok(), Some(0o600));
        assert_eq!(std::fs::read(&path).ok().as_deref(), Some(&b"two"[..]));
    }
}
