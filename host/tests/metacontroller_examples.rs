//! The Metacontroller examples: every directory under examples/metacontroller passes the unit
//! tests of its hook, its Python ones (tests/test_*.py) with pytest through
//! scripts/python-module.sh, its JavaScript ones (tests/*.test.js) with `node --test` through
//! scripts/js-module.sh. The directories are found, not listed: a new example is covered without
//! editing this file, and an example without unit tests fails it (never a skip).
//!
//! The first run installs the pinned Python tools (network); later runs are offline. A missing
//! Python or node fails this test with the script's message.

// Only `root` and `script` are used here: a failure is collected, not panicked on as `succeed`
// does, so that one run names every failing example.
#[allow(dead_code)]
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{root, script};

/// The examples' directories, sorted.
fn examples() -> Vec<PathBuf> {
    let dir = root().join("examples/metacontroller");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.is_dir())
        .collect();
    dirs.sort();
    dirs
}

/// Whether `dir/tests` holds a file whose name passes `matches`.
fn has_tests(dir: &Path, matches: impl Fn(&str) -> bool) -> bool {
    let Ok(entries) = std::fs::read_dir(dir.join("tests")) else {
        return false;
    };
    entries
        .map(|entry| entry.expect("a directory entry").file_name())
        .any(|name| name.to_str().is_some_and(&matches))
}

/// The number after `prefix` on the last line that starts with it (`# pass 12`, node's summary).
fn count_after(text: &str, prefix: &str) -> Option<u64> {
    text.lines()
        .rev()
        .find_map(|line| line.trim().strip_prefix(prefix)?.trim().parse().ok())
}

/// The number just before `suffix` on the last line that has it (`8 passed`, pytest's summary).
fn count_before(text: &str, suffix: &str) -> Option<u64> {
    text.lines().rev().find_map(|line| {
        let (head, _) = line.split_once(suffix)?;
        head.split(|c: char| !c.is_ascii_digit())
            .rfind(|word| !word.is_empty())?
            .parse()
            .ok()
    })
}

/// pytest in `dir`: the number of passed tests, or the failure with the output.
fn pytest(dir: &Path) -> Result<u64, String> {
    let mut cmd = script("python-module.sh");
    cmd.arg("pytest").arg(dir);
    let text = output(&format!("pytest {}", dir.display()), cmd)?;
    match count_before(&text, " passed") {
        Some(passed) if passed > 0 => Ok(passed),
        _ => Err(format!("pytest {}: no passed test\n{text}", dir.display())),
    }
}

/// `node --test` of `dir`'s tests: the number of passed tests, or the failure with the output.
fn node_test(dir: &Path) -> Result<u64, String> {
    let mut cmd = script("js-module.sh");
    cmd.arg("test").arg(dir);
    let text = output(&format!("node --test {}", dir.display()), cmd)?;
    let passed = count_after(&text, "# pass").unwrap_or(0);
    let failed = count_after(&text, "# fail");
    if passed > 0 && failed == Some(0) {
        Ok(passed)
    } else {
        Err(format!(
            "node --test {}: {passed} passed, {failed:?} failed\n{text}",
            dir.display()
        ))
    }
}

/// The stdout and stderr of `cmd` if it succeeded, else the failure naming `what` with both.
fn output(what: &str, mut cmd: Command) -> Result<String, String> {
    let out = cmd.output().expect("runs bash");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        Ok(format!("{stdout}{stderr}"))
    } else {
        Err(format!(
            "{what} failed ({}):\n{stdout}\n{stderr}",
            out.status
        ))
    }
}

#[test]
fn every_metacontroller_example_passes_the_unit_tests_of_its_hook() {
    let dirs = examples();
    assert!(
        !dirs.is_empty(),
        "no directory under examples/metacontroller"
    );
    let mut failures = Vec::new();
    for dir in &dirs {
        let name = dir.display().to_string();
        let python = has_tests(dir, |f| f.starts_with("test_") && f.ends_with(".py"));
        let js = has_tests(dir, |f| f.ends_with(".test.js") || f.ends_with(".test.mjs"));
        if !python && !js {
            failures.push(format!(
                "{name}: no unit tests (tests/test_*.py or tests/*.test.js)"
            ));
        }
        for (ran, run) in [(python, pytest as fn(&Path) -> _), (js, node_test)] {
            if ran {
                match run(dir) {
                    Ok(passed) => eprintln!("{name}: {passed} passed"),
                    Err(failure) => failures.push(failure),
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} examples failed:\n\n{}",
        failures.len(),
        dirs.len(),
        failures.join("\n\n")
    );
}
