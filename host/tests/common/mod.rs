//! Helpers shared by the test binaries that build and test guest modules with the repository's
//! module scripts (js.rs: scripts/js-module.sh, python.rs: scripts/python-module.sh).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The repository's root (the host crate's parent).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `bash scripts/<name>`: one of the repository's module scripts, its arguments to be added.
pub fn script(name: &str) -> Command {
    let mut cmd = Command::new("bash");
    cmd.arg(root().join("scripts").join(name));
    cmd
}

/// The stdout and stderr of `out`, which must have succeeded: else the test fails, naming
/// `what` with both.
pub fn succeed(what: &str, out: Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    stdout + &stderr
}

/// Builds the component `app` of the directory `dir` into `out` with `script` (`build DIR APP
/// OUT`; the script skips it when up to date), failing the test as `what`; returns `out`.
pub fn build(mut script: Command, dir: &Path, app: &str, out: PathBuf, what: &str) -> PathBuf {
    let result = script
        .arg("build")
        .arg(dir)
        .arg(app)
        .arg(&out)
        .output()
        .expect("runs bash");
    succeed(what, result);
    out
}
