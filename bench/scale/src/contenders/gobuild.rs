//! The Go controller-runtime operator (bench/controller-runtime), built with `go build` once and
//! cached as `<cache>/bin/scale-controller-runtime-<hash>`, the hash covering go.mod, go.sum and
//! every .go file, like the control-plane binaries (`<cache>` is wasmop-testenv's cache dir).
//!
//! # Guarantees
//! - Pinned versions (go.mod/go.sum), `GOTOOLCHAIN=local`, `CGO_ENABLED=0`, the default Go
//!   build and module caches; a finished binary appears under its final name atomically.
//!
//! # Errors
//! [`Error::Other`] when `go` is missing or the build fails (with its output).

use std::path::PathBuf;

use sha2::{Digest, Sha256};

use crate::cluster::repo;
use crate::{Error, Result};

/// Where the Go module is.
pub fn source_dir() -> PathBuf {
    repo().join("bench/controller-runtime")
}

fn source_hash() -> Result<String> {
    let dir = source_dir();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(Error::io("listing", &dir))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension().is_some_and(|e| e == "go")
                || p.file_name()
                    .is_some_and(|n| n == "go.mod" || n == "go.sum")
        })
        .collect();
    files.sort();
    let mut hash = Sha256::new();
    for file in files {
        let bytes = std::fs::read(&file).map_err(Error::io("reading", &file))?;
        hash.update(
            file.file_name()
                .map(|n| n.as_encoded_bytes())
                .unwrap_or_default(),
        );
        hash.update((bytes.len() as u64).to_le_bytes());
        hash.update(&bytes);
    }
    Ok(hex::encode(hash.finalize())[..16].to_string())
}

/// The operator's binary, built if it is not cached yet.
///
/// # Errors
/// See the module docs.
pub fn operator() -> Result<PathBuf> {
    let bin_dir = wasmop_testenv::assets::cache_dir().join("bin");
    let path = bin_dir.join(format!("scale-controller-runtime-{}", source_hash()?));
    if path.is_file() {
        return Ok(path);
    }
    std::fs::create_dir_all(&bin_dir).map_err(Error::io("creating", &bin_dir))?;
    let partial = bin_dir.join(format!(
        ".scale-controller-runtime-{}.partial",
        std::process::id()
    ));
    eprintln!(
        "[bench] building the controller-runtime operator (go build, cached as {})",
        path.display()
    );
    let output = std::process::Command::new("go")
        .args(["build", "-trimpath", "-o"])
        .arg(&partial)
        .arg(".")
        .current_dir(source_dir())
        .env("GOTOOLCHAIN", "local")
        .env("CGO_ENABLED", "0")
        .output()
        .map_err(|e| {
            Error::Other(format!(
                "cannot run `go` ({e}): install Go 1.26 to build the controller-runtime contender"
            ))
        })?;
    if !output.status.success() {
        let _ = std::fs::remove_file(&partial);
        return Err(Error::Other(format!(
            "go build in {} failed ({}):\n{}",
            source_dir().display(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    std::fs::rename(&partial, &path).map_err(Error::io("renaming", &partial))?;
    Ok(path)
}
