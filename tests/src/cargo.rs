//! A `cargo` command for a nested build (the `wasmop` binary that tests and benchmarks run).
//!
//! A test or benchmark runs with the environment cargo gives the package under test:
//! `CARGO_PKG_NAME`, `CARGO_MANIFEST_DIR`, `OUT_DIR` and the like. Build scripts of dependencies
//! (ring and aws-lc among them) ask to rerun when exactly those variables change, so a nested
//! `cargo build` that inherits them sees different values than the build from the shell and
//! rebuilds ring, rustls, kube and everything above them (minutes, each time).
//!
//! # Guarantees
//! - The command runs the same cargo as the caller (`$CARGO`, else `cargo` on the `PATH`).
//! - Per-package variables that cargo sets for a run are removed; configuration (`CARGO_HOME`,
//!   `CARGO_TARGET_DIR`, `CARGO_INCREMENTAL`, `CARGO_PROFILE_*`, ...) is kept.

/// Variables cargo sets for the package it runs, by prefix or exact name.
const PER_PACKAGE_PREFIXES: &[&str] = &[
    "CARGO_PKG_",
    "CARGO_MANIFEST_",
    "CARGO_CRATE_",
    "CARGO_BIN_",
    "CARGO_CFG_",
];
const PER_PACKAGE_NAMES: &[&str] = &[
    "CARGO_PRIMARY_PACKAGE",
    "CARGO_TARGET_TMPDIR",
    "CARGO_RUSTC_CURRENT_DIR",
    "OUT_DIR",
];

/// Whether cargo set `name` for the package being run (so a nested build must not inherit it).
pub fn is_per_package(name: &str) -> bool {
    PER_PACKAGE_NAMES.contains(&name) || PER_PACKAGE_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// The per-package variables set in this process: what a nested cargo must not inherit
/// (remove them from any command that ends up running cargo, scripts included).
pub fn per_package_variables() -> Vec<std::ffi::OsString> {
    std::env::vars_os()
        .map(|(name, _)| name)
        .filter(|name| is_per_package(&name.to_string_lossy()))
        .collect()
}

/// `cargo` without the caller's per-package environment.
pub fn command() -> tokio::process::Command {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut command = tokio::process::Command::new(cargo);
    for name in per_package_variables() {
        command.env_remove(name);
    }
    command
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_package_variables_go_and_configuration_stays() {
        for gone in [
            "CARGO_PKG_NAME",
            "CARGO_MANIFEST_DIR",
            "CARGO_MANIFEST_LINKS",
            "OUT_DIR",
            "CARGO_CRATE_NAME",
            "CARGO_BIN_EXE_wasmop",
        ] {
            assert!(is_per_package(gone), "{gone}");
        }
        for kept in [
            "CARGO",
            "CARGO_HOME",
            "CARGO_TARGET_DIR",
            "CARGO_INCREMENTAL",
            "CARGO_PROFILE_BENCH_DEBUG",
            "PATH",
        ] {
            assert!(!is_per_package(kept), "{kept}");
        }
    }
}
