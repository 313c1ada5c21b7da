//! `wasmop new NAME [--lang rust] [--kind KIND] [--group GROUP] [--dir DIR] [--sdk-path DIR]`:
//! scaffold a module project that builds and passes `wasmop test` out of the box.
//!
//! The project holds the reconciler skeleton (`src/lib.rs`), its build settings (`Cargo.toml`,
//! `rust-toolchain.toml`), a fixture and its golden file (`fixtures/`), the cluster side (`k8s/`:
//! a CRD from a small schema, RBAC, the WasmReconciler) and a README. Without `--sdk-path` it
//! also holds the SDK this wasmop was built with (`wasmop-sdk/`, a path dependency, and the
//! contract it is generated from, `wit/reconciler.wit`): the project builds on a machine with
//! only the `wasmop` binary and the toolchains, with no checkout and no registry release.
//!
//! With `--lang python` the project is the Python equivalent: the reconciler (`NAME.py`, with
//! the Python SDK), its build settings (`build.sh` and the pinned `requirements.txt`: the
//! component is built with componentize-py, installed once, offline afterwards), pytest
//! (`tests/`, `pyproject.toml`), the same fixtures and `k8s/` (the WasmReconciler names an OCI
//! source: a Python component does not fit a ConfigMap), and a copy of the SDK (`wasmop_sdk/`)
//! and of the contract (`wit/reconciler.wit`) of this wasmop, so the project needs no checkout.
//!
//! With `--lang js` the project is the JavaScript equivalent: the reconciler (`NAME.js`, whose
//! default export is the reconciler), its build (`build.sh`, `tools/`: the pinned
//! `package.json` and `package-lock.json` of componentize-js and jco, installed once with
//! `npm ci`, and the build script), `node --test` (`tests/`, `package.json`), the same fixtures
//! and `k8s/` (an OCI source: a JavaScript component embeds SpiderMonkey, ~12 MB), and copies of
//! the SDK (`wasmop-sdk/`) and of the contract (`wit/reconciler.wit`) of this wasmop.
//!
//! # Extension point: other languages
//! A language is a [`Lang`] variant and a [`Template`] (a list of files with `{{placeholders}}`
//! in their paths and contents, embedded with `include_str!`); [`render`] and [`write_project`]
//! are language-neutral.
//!
//! # Errors
//! [`CliError::Other`] for an invalid name, kind or group, or a directory that exists and is not
//! empty; [`CliError::Io`] when a file cannot be written.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use super::CliError;

/// Arguments of `new`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The module's name: lowercase letters, digits and `-`, starting with a letter (also the
    /// crate, the WasmReconciler and the ServiceAccount name).
    pub name: String,
    /// The language of the module.
    #[arg(long, value_enum, default_value_t = Lang::Rust)]
    pub lang: Lang,
    /// The primary's kind (default: the name in PascalCase).
    #[arg(long)]
    pub kind: Option<String>,
    /// The primary's API group.
    #[arg(long, default_value = "example.com")]
    pub group: String,
    /// The namespace of the module's ConfigMap and ServiceAccount (default: the name).
    #[arg(long)]
    pub namespace: Option<String>,
    /// Where to write the project (default: ./NAME). It must not exist or be empty.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Depend on the SDK at this path (a wasmop checkout's `guest-sdk`) instead of the copy of
    /// this wasmop's SDK written into the project (Rust only: a Python or JavaScript project
    /// carries its SDK).
    #[arg(long)]
    pub sdk_path: Option<PathBuf>,
}

/// The languages `wasmop new` scaffolds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    /// Rust, with the `wasmop-sdk` crate.
    Rust,
    /// Python, with the Python SDK, built with componentize-py.
    Python,
    /// JavaScript, with the JavaScript SDK, built with componentize-js.
    #[value(name = "js", alias = "javascript")]
    Js,
}

/// A project template: relative paths and their contents, with `{{placeholders}}`.
pub type Template = &'static [(&'static str, &'static str)];

const RUST: Template = &[
    (
        "Cargo.toml",
        include_str!("../../templates/new-rust/Cargo.toml"),
    ),
    (
        "rust-toolchain.toml",
        include_str!("../../templates/new-rust/rust-toolchain.toml"),
    ),
    (
        ".gitignore",
        include_str!("../../templates/new-rust/gitignore"),
    ),
    (
        "README.md",
        include_str!("../../templates/new-rust/README.md"),
    ),
    (
        "src/lib.rs",
        include_str!("../../templates/new-rust/src/lib.rs"),
    ),
    (
        "fixtures/cr.yaml",
        include_str!("../../templates/new-rust/fixtures/cr.yaml"),
    ),
    (
        "fixtures/expected.yaml",
        include_str!("../../templates/new-rust/fixtures/expected.yaml"),
    ),
    (
        "k8s/crd.yaml",
        include_str!("../../templates/new-rust/k8s/crd.yaml"),
    ),
    (
        "k8s/rbac.yaml",
        include_str!("../../templates/new-rust/k8s/rbac.yaml"),
    ),
    (
        "k8s/wasmreconciler.yaml",
        include_str!("../../templates/new-rust/k8s/wasmreconciler.yaml"),
    ),
];

/// The Rust SDK of this wasmop, written verbatim (no placeholders) into a project generated
/// without `--sdk-path`: `wasmop-sdk/` (guest-sdk's sources and a manifest with the workspace's
/// versions written out) and the contract its bindings are generated from (`wit/`, where
/// guest-sdk's `generate!` looks: `../wit` from the crate).
const RUST_SDK: Template = &[
    (
        "wasmop-sdk/Cargo.toml",
        include_str!("../../templates/sdk/Cargo.toml"),
    ),
    (
        "wasmop-sdk/src/lib.rs",
        include_str!("../../../guest-sdk/src/lib.rs"),
    ),
    (
        "wasmop-sdk/src/__glue.rs",
        include_str!("../../../guest-sdk/src/__glue.rs"),
    ),
    (
        "wasmop-sdk/src/error.rs",
        include_str!("../../../guest-sdk/src/error.rs"),
    ),
    (
        "wasmop-sdk/src/kinds.rs",
        include_str!("../../../guest-sdk/src/kinds.rs"),
    ),
    (
        "wasmop-sdk/src/log.rs",
        include_str!("../../../guest-sdk/src/log.rs"),
    ),
    (
        "wasmop-sdk/src/object.rs",
        include_str!("../../../guest-sdk/src/object.rs"),
    ),
    (
        "wasmop-sdk/src/request.rs",
        include_str!("../../../guest-sdk/src/request.rs"),
    ),
    (
        "wasmop-sdk/src/response.rs",
        include_str!("../../../guest-sdk/src/response.rs"),
    ),
    (
        "wasmop-sdk/src/testing.rs",
        include_str!("../../../guest-sdk/src/testing.rs"),
    ),
    (
        "wit/reconciler.wit",
        include_str!("../../../wit/reconciler.wit"),
    ),
];

const PYTHON: Template = &[
    (
        "{{crate}}.py",
        include_str!("../../templates/new-python/app.py"),
    ),
    (
        "build.sh",
        include_str!("../../templates/new-python/build.sh"),
    ),
    // The pins of wasmop's own Python builds, byte for byte: both share one venv.
    (
        "requirements.txt",
        include_str!("../../../guest-sdk/python/requirements.txt"),
    ),
    (
        "pyproject.toml",
        include_str!("../../templates/new-python/pyproject.toml"),
    ),
    (
        ".gitignore",
        include_str!("../../templates/new-python/gitignore"),
    ),
    (
        "README.md",
        include_str!("../../templates/new-python/README.md"),
    ),
    (
        "tests/test_{{crate}}.py",
        include_str!("../../templates/new-python/tests/test_app.py"),
    ),
    (
        "fixtures/cr.yaml",
        include_str!("../../templates/new-python/fixtures/cr.yaml"),
    ),
    (
        "fixtures/expected.yaml",
        include_str!("../../templates/new-python/fixtures/expected.yaml"),
    ),
    (
        "k8s/crd.yaml",
        include_str!("../../templates/new-python/k8s/crd.yaml"),
    ),
    (
        "k8s/rbac.yaml",
        include_str!("../../templates/new-python/k8s/rbac.yaml"),
    ),
    (
        "k8s/wasmreconciler.yaml",
        include_str!("../../templates/new-python/k8s/wasmreconciler.yaml"),
    ),
    // The contract and the SDK of this wasmop, copied as they are (they hold no placeholders).
    (
        "wit/reconciler.wit",
        include_str!("../../../wit/reconciler.wit"),
    ),
    (
        "wasmop_sdk/__init__.py",
        include_str!("../../../guest-sdk/python/wasmop_sdk/__init__.py"),
    ),
    (
        "wasmop_sdk/_glue.py",
        include_str!("../../../guest-sdk/python/wasmop_sdk/_glue.py"),
    ),
    (
        "wasmop_sdk/errors.py",
        include_str!("../../../guest-sdk/python/wasmop_sdk/errors.py"),
    ),
    (
        "wasmop_sdk/k8s.py",
        include_str!("../../../guest-sdk/python/wasmop_sdk/k8s.py"),
    ),
    (
        "wasmop_sdk/kinds.py",
        include_str!("../../../guest-sdk/python/wasmop_sdk/kinds.py"),
    ),
    (
        "wasmop_sdk/log.py",
        include_str!("../../../guest-sdk/python/wasmop_sdk/log.py"),
    ),
    (
        "wasmop_sdk/reconciler.py",
        include_str!("../../../guest-sdk/python/wasmop_sdk/reconciler.py"),
    ),
    (
        "wasmop_sdk/request.py",
        include_str!("../../../guest-sdk/python/wasmop_sdk/request.py"),
    ),
    (
        "wasmop_sdk/response.py",
        include_str!("../../../guest-sdk/python/wasmop_sdk/response.py"),
    ),
    (
        "wasmop_sdk/testing.py",
        include_str!("../../../guest-sdk/python/wasmop_sdk/testing.py"),
    ),
];

const JS: Template = &[
    (
        "{{crate}}.js",
        include_str!("../../templates/new-js/app.js"),
    ),
    ("build.sh", include_str!("../../templates/new-js/build.sh")),
    (
        "package.json",
        include_str!("../../templates/new-js/package.json"),
    ),
    (
        ".gitignore",
        include_str!("../../templates/new-js/gitignore"),
    ),
    (
        "README.md",
        include_str!("../../templates/new-js/README.md"),
    ),
    (
        "tests/{{crate}}.test.js",
        include_str!("../../templates/new-js/tests/app.test.js"),
    ),
    // The same fixtures and cluster side as a Python project (the module answers alike).
    (
        "fixtures/cr.yaml",
        include_str!("../../templates/new-python/fixtures/cr.yaml"),
    ),
    (
        "fixtures/expected.yaml",
        include_str!("../../templates/new-python/fixtures/expected.yaml"),
    ),
    (
        "k8s/crd.yaml",
        include_str!("../../templates/new-python/k8s/crd.yaml"),
    ),
    (
        "k8s/rbac.yaml",
        include_str!("../../templates/new-python/k8s/rbac.yaml"),
    ),
    (
        "k8s/wasmreconciler.yaml",
        include_str!("../../templates/new-js/k8s/wasmreconciler.yaml"),
    ),
    // The pins and the build script of wasmop's own JavaScript builds, byte for byte: both share
    // one tools directory in the cache.
    (
        "tools/package.json",
        include_str!("../../../guest-sdk/js/tools/package.json"),
    ),
    (
        "tools/package-lock.json",
        include_str!("../../../guest-sdk/js/tools/package-lock.json"),
    ),
    (
        "tools/build.mjs",
        include_str!("../../../guest-sdk/js/tools/build.mjs"),
    ),
    // The contract and the SDK of this wasmop, copied as they are (they hold no placeholders).
    (
        "wit/reconciler.wit",
        include_str!("../../../wit/reconciler.wit"),
    ),
    (
        "wasmop-sdk/index.js",
        include_str!("../../../guest-sdk/js/src/index.js"),
    ),
    (
        "wasmop-sdk/errors.js",
        include_str!("../../../guest-sdk/js/src/errors.js"),
    ),
    (
        "wasmop-sdk/glue.js",
        include_str!("../../../guest-sdk/js/src/glue.js"),
    ),
    (
        "wasmop-sdk/hook.js",
        include_str!("../../../guest-sdk/js/src/hook.js"),
    ),
    (
        "wasmop-sdk/k8s.js",
        include_str!("../../../guest-sdk/js/src/k8s.js"),
    ),
    (
        "wasmop-sdk/kinds.js",
        include_str!("../../../guest-sdk/js/src/kinds.js"),
    ),
    (
        "wasmop-sdk/log.js",
        include_str!("../../../guest-sdk/js/src/log.js"),
    ),
    (
        "wasmop-sdk/register.js",
        include_str!("../../../guest-sdk/js/src/register.js"),
    ),
    (
        "wasmop-sdk/request.js",
        include_str!("../../../guest-sdk/js/src/request.js"),
    ),
    (
        "wasmop-sdk/resolve.js",
        include_str!("../../../guest-sdk/js/src/resolve.js"),
    ),
    (
        "wasmop-sdk/response.js",
        include_str!("../../../guest-sdk/js/src/response.js"),
    ),
    (
        "wasmop-sdk/testing.js",
        include_str!("../../../guest-sdk/js/src/testing.js"),
    ),
];

/// Python's keywords: a module (`NAME.py`, imported by its tests) cannot be named after one.
const PYTHON_KEYWORDS: &[&str] = &[
    "and", "as", "assert", "async", "await", "break", "class", "continue", "def", "del", "elif",
    "else", "except", "finally", "for", "from", "global", "if", "import", "in", "is", "lambda",
    "nonlocal", "not", "or", "pass", "raise", "return", "try", "while", "with", "yield",
];

/// The SDK dependency a project gets without `--sdk-path`: the copy in the project ([`RUST_SDK`]).
const SDK_IN_PROJECT: &str = r#"wasmop-sdk = { path = "wasmop-sdk" }"#;

impl Lang {
    fn template(self) -> Template {
        match self {
            Lang::Rust => RUST,
            Lang::Python => PYTHON,
            Lang::Js => JS,
        }
    }
}

/// The values substituted into a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    /// `hello-op`.
    pub name: String,
    /// `hello_op` (the crate's library name; the `.wasm` file's stem).
    pub krate: String,
    /// `HelloOp`.
    pub kind: String,
    /// `helloops`.
    pub plural: String,
    /// `example.com`.
    pub group: String,
    /// The module's namespace.
    pub namespace: String,
    /// The `wasmop-sdk = ...` line of `Cargo.toml`.
    pub sdk_dependency: String,
}

impl Names {
    /// Checks and derives every name from the arguments.
    ///
    /// # Errors
    /// [`CliError::Other`] naming the value that Kubernetes or cargo would refuse.
    pub fn from_args(args: &Args) -> Result<Names, CliError> {
        let name = args.name.as_str();
        if !is_dns_label(name) {
            return Err(CliError::Other(format!(
                "{name:?} is not a valid module name: use lowercase letters, digits and '-', starting with a letter, at most 63 characters (e.g. hello-op)"
            )));
        }
        let kind = args.kind.clone().unwrap_or_else(|| pascal_case(name));
        let kind_ok = kind.starts_with(|c: char| c.is_ascii_uppercase())
            && kind.chars().all(|c| c.is_ascii_alphanumeric());
        if !kind_ok {
            return Err(CliError::Other(format!(
                "--kind {kind:?} is not a Kubernetes kind: use letters and digits, starting with an uppercase letter (e.g. Greeting)"
            )));
        }
        if !args.group.contains('.') || !args.group.split('.').all(is_dns_label) {
            return Err(CliError::Other(format!(
                "--group {:?} is not an API group: use a DNS name with a dot (e.g. example.com)",
                args.group
            )));
        }
        let namespace = args.namespace.clone().unwrap_or_else(|| name.to_string());
        if !is_dns_label(&namespace) {
            return Err(CliError::Other(format!(
                "--namespace {namespace:?} is not a valid namespace name"
            )));
        }
        let krate = name.replace('-', "_");
        if args.lang == Lang::Js && args.sdk_path.is_some() {
            return Err(CliError::Other(
                "--sdk-path is for --lang rust: a JavaScript project carries a copy of the SDK (wasmop-sdk/)".into(),
            ));
        }
        if args.lang == Lang::Python {
            if args.sdk_path.is_some() {
                return Err(CliError::Other(
                    "--sdk-path is for --lang rust: a Python project carries a copy of the SDK (wasmop_sdk/)".into(),
                ));
            }
            if PYTHON_KEYWORDS.contains(&krate.as_str()) {
                return Err(CliError::Other(format!(
                    "{name:?} is a Python keyword and cannot name the module's file (e.g. use {name}-op)"
                )));
            }
        }
        let sdk_dependency = match &args.sdk_path {
            Some(path) => format!(
                "wasmop-sdk = {{ path = {:?} }}",
                path.to_string_lossy().as_ref()
            ),
            None => SDK_IN_PROJECT.to_string(),
        };
        Ok(Names {
            name: name.to_string(),
            krate,
            plural: format!("{}s", kind.to_ascii_lowercase()),
            kind,
            group: args.group.clone(),
            namespace,
            sdk_dependency,
        })
    }
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.starts_with(|c: char| c.is_ascii_lowercase())
        && !s.ends_with('-')
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

fn pascal_case(name: &str) -> String {
    name.split('-')
        .map(|part| {
            let mut chars = part.chars();
            chars
                .next()
                .map(|first| first.to_ascii_uppercase().to_string() + chars.as_str())
                .unwrap_or_default()
        })
        .collect()
}

/// Substitutes the placeholders of one template file.
pub fn render(text: &str, names: &Names) -> String {
    text.replace("{{name}}", &names.name)
        .replace("{{crate}}", &names.krate)
        .replace("{{Kind}}", &names.kind)
        .replace("{{plural}}", &names.plural)
        .replace("{{singular}}", &names.kind.to_ascii_lowercase())
        .replace("{{group}}", &names.group)
        .replace("{{namespace}}", &names.namespace)
        .replace("{{sdk_dependency}}", &names.sdk_dependency)
}

/// Writes every file of `template` under `dir`, rendered.
///
/// # Errors
/// [`CliError::Other`] if `dir` exists and is not empty (nothing is overwritten),
/// [`CliError::Io`] if a file cannot be written.
pub fn write_project(dir: &Path, template: Template, names: &Names) -> Result<(), CliError> {
    let occupied = std::fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_some());
    if occupied {
        return Err(CliError::Other(format!(
            "{} exists and is not empty; choose another --dir (nothing was written)",
            dir.display()
        )));
    }
    for (relative, text) in template {
        write_file(dir, &render(relative, names), &render(text, names))?;
    }
    Ok(())
}

/// Writes the copy of this wasmop's Rust SDK ([`RUST_SDK`]) under `dir`, verbatim.
///
/// # Errors
/// [`CliError::Io`] if a file cannot be written.
pub fn write_sdk(dir: &Path) -> Result<(), CliError> {
    for (relative, text) in RUST_SDK {
        write_file(dir, relative, text)?;
    }
    Ok(())
}

/// Writes one file under `dir` (its folders too); a `.sh` file is made executable.
fn write_file(dir: &Path, relative: &str, text: &str) -> Result<(), CliError> {
    let path = dir.join(relative);
    let write = |source| CliError::Io {
        action: "cannot write",
        path: path.clone(),
        source,
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(write)?;
    }
    std::fs::write(&path, text).map_err(write)?;
    if relative.ends_with(".sh") {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).map_err(write)?;
    }
    Ok(())
}

pub(crate) fn run(args: Args) -> Result<ExitCode, CliError> {
    let names = Names::from_args(&args)?;
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(&names.name));
    write_project(&dir, args.lang.template(), &names)?;
    if args.lang == Lang::Rust && args.sdk_path.is_none() {
        write_sdk(&dir)?;
    }
    let (build, wasm) = match args.lang {
        Lang::Rust => (
            "cargo build --release --target wasm32-wasip2\n  ".to_string(),
            format!("target/wasm32-wasip2/release/{}.wasm", names.krate),
        ),
        Lang::Python | Lang::Js => (
            "./build.sh\n  ./build.sh test\n  ".to_string(),
            format!("build/{}.wasm", names.krate),
        ),
    };
    eprintln!(
        "created {} ({} {} in {}/v1)\nnext:\n  cd {}\n  {build}wasmop test {wasm} --reconciler {} --object fixtures/cr.yaml --expect fixtures/expected.yaml",
        dir.display(),
        names.name,
        names.kind,
        names.group,
        dir.display(),
        names.name,
    );
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(name: &str) -> Args {
        Args {
            name: name.into(),
            lang: Lang::Rust,
            kind: None,
            group: "example.com".into(),
            namespace: None,
            dir: None,
            sdk_path: None,
        }
    }

    #[test]
    fn names_derive_from_the_module_name() {
        let names = Names::from_args(&args("hello-op")).ok();
        let names = names.as_ref();
        assert_eq!(names.map(|n| n.kind.as_str()), Some("HelloOp"));
        assert_eq!(names.map(|n| n.krate.as_str()), Some("hello_op"));
        assert_eq!(names.map(|n| n.plural.as_str()), Some("helloops"));
        assert_eq!(names.map(|n| n.namespace.as_str()), Some("hello-op"));
    }

    #[test]
    fn invalid_names_are_refused_with_an_example() {
        for bad in ["", "Hello", "1op", "op-", "a_b", &"a".repeat(64)] {
            let e = Names::from_args(&args(bad)).err().map(|e| e.to_string());
            assert!(e.is_some_and(|e| e.contains("e.g.")), "{bad:?}");
        }
        let mut a = args("op");
        a.group = "nodot".into();
        assert!(Names::from_args(&a).is_err());
    }

    #[test]
    fn every_placeholder_is_substituted() {
        let names = Names::from_args(&args("hello-op")).ok();
        for (path, text) in RUST.iter().chain(PYTHON).chain(JS) {
            let rendered = names.as_ref().map(|n| render(text, n)).unwrap_or_default();
            assert!(!rendered.contains("{{"), "{path} keeps a placeholder");
            let path = names.as_ref().map(|n| render(path, n)).unwrap_or_default();
            assert!(!path.contains("{{"), "{path} keeps a placeholder");
        }
    }

    #[test]
    fn python_names_its_files_after_the_module_and_refuses_what_python_cannot_import() {
        let mut a = args("hello-op");
        a.lang = Lang::Python;
        let names = Names::from_args(&a).ok();
        let paths: Vec<String> = PYTHON
            .iter()
            .filter_map(|(p, _)| names.as_ref().map(|n| render(p, n)))
            .collect();
        assert!(paths.contains(&"hello_op.py".to_string()), "{paths:?}");
        assert!(paths.contains(&"tests/test_hello_op.py".to_string()));
        let mut keyword = args("import");
        keyword.lang = Lang::Python;
        assert!(Names::from_args(&keyword).is_err());
        a.sdk_path = Some(PathBuf::from("/x"));
        assert!(Names::from_args(&a).is_err());
    }

    #[test]
    fn js_names_its_files_after_the_module_and_carries_the_sdk_and_the_tools() {
        let mut a = args("hello-op");
        a.lang = Lang::Js;
        let names = Names::from_args(&a).ok();
        let paths: Vec<String> = JS
            .iter()
            .filter_map(|(p, _)| names.as_ref().map(|n| render(p, n)))
            .collect();
        for want in [
            "hello_op.js",
            "tests/hello_op.test.js",
            "build.sh",
            "wit/reconciler.wit",
            "tools/package-lock.json",
            "tools/build.mjs",
            "wasmop-sdk/index.js",
        ] {
            assert!(paths.contains(&want.to_string()), "{want} in {paths:?}");
        }
        // The app's test imports the app by the name it is written under.
        let test = JS
            .iter()
            .find(|(p, _)| *p == "tests/{{crate}}.test.js")
            .and_then(|(_, t)| names.as_ref().map(|n| render(t, n)))
            .unwrap_or_default();
        assert!(test.contains("from '../hello_op.js'"), "{test}");
        a.sdk_path = Some(PathBuf::from("/x"));
        let refused = Names::from_args(&a).err().map(|e| e.to_string());
        assert!(refused.is_some_and(|e| e.contains("--sdk-path is for --lang rust")));
    }

    /// The paths under `prefix` that `list` copies, and the files of the repository's `dir` as
    /// they would be copied (`prefix` and the file name); both sorted.
    fn copied_and_on_disk(list: Template, dir: &str, prefix: &str) -> (Vec<String>, Vec<String>) {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(dir);
        let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .map(|name| format!("{prefix}{name}"))
                    .collect()
            })
            .unwrap_or_default();
        on_disk.sort();
        let mut copied: Vec<String> = list
            .iter()
            .map(|(path, _)| path.to_string())
            .filter(|path| path.starts_with(prefix))
            .collect();
        copied.sort();
        (copied, on_disk)
    }

    #[test]
    fn the_js_sdk_copy_has_every_source_file_of_guest_sdk_js() {
        let (copied, on_disk) = copied_and_on_disk(JS, "guest-sdk/js/src", "wasmop-sdk/");
        assert!(!on_disk.is_empty());
        assert_eq!(
            copied, on_disk,
            "JS must list every file of guest-sdk/js/src"
        );
        // Verbatim: the SDK, the tools and the contract hold no placeholder to render.
        for (path, text) in JS {
            if path.starts_with("wasmop-sdk/")
                || path.starts_with("tools/")
                || path.starts_with("wit/")
            {
                assert!(!text.contains("{{"), "{path} would be rendered");
            }
        }
    }

    /// The repository file at `relative` (from the host crate's parent).
    fn repo_file(relative: &str) -> String {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(relative);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// `name = spec` of a manifest line, `name.workspace = true` read as `name = workspace`.
    fn dependency(line: &str) -> Option<(&str, &str)> {
        let (name, spec) = line.split_once('=')?;
        let name = name.trim().trim_end_matches(".workspace");
        Some((name, spec.trim()))
    }

    #[test]
    fn the_sdk_copy_has_every_source_file_of_guest_sdk() {
        let (copied, on_disk) = copied_and_on_disk(RUST_SDK, "guest-sdk/src", "wasmop-sdk/src/");
        assert_eq!(
            copied, on_disk,
            "RUST_SDK must list every file of guest-sdk/src"
        );
    }

    #[test]
    fn the_sdk_copy_s_manifest_has_the_workspace_s_versions() {
        let copy = RUST_SDK
            .iter()
            .find(|(path, _)| *path == "wasmop-sdk/Cargo.toml")
            .map(|(_, text)| *text)
            .unwrap_or_default();
        let workspace = repo_file("Cargo.toml");
        for key in ["version", "edition", "rust-version", "license"] {
            let line = workspace
                .lines()
                .skip_while(|l| *l != "[workspace.package]")
                .find(|l| l.starts_with(&format!("{key} =")))
                .unwrap_or_default();
            assert!(copy.lines().any(|l| l == line), "the copy lacks {line:?}");
        }
        let in_workspace = |name: &str| {
            workspace
                .lines()
                .skip_while(|l| *l != "[workspace.dependencies]")
                .filter_map(dependency)
                .find(|(n, _)| *n == name)
                .map(|(_, spec)| match spec.strip_prefix('"') {
                    Some(_) => format!("{{ version = {spec} }}"),
                    None => spec.to_string(),
                })
                .unwrap_or_default()
        };
        let sdk = repo_file("guest-sdk/Cargo.toml");
        let mut section = "";
        let mut deps = Vec::new();
        for line in sdk.lines() {
            if line.starts_with('[') {
                section = line;
            } else if section.ends_with("dependencies]") {
                deps.extend(dependency(line));
            }
        }
        assert!(deps.len() >= 5, "guest-sdk's dependencies: {deps:?}");
        for (name, spec) in deps {
            let mut want = in_workspace(name);
            if spec.contains("optional = true") {
                want = want.replace(" }", ", optional = true }");
            }
            let line = format!("{name} = {want}");
            assert!(copy.lines().any(|l| l == line), "the copy lacks {line:?}");
        }
    }

    #[test]
    fn an_occupied_directory_is_never_overwritten() {
        let dir = std::env::temp_dir().join(format!("wasmop-new-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let _ = std::fs::write(dir.join("keep"), "mine");
        let names = Names::from_args(&args("op")).ok();
        let result = names.map(|n| write_project(&dir, RUST, &n));
        assert!(matches!(result, Some(Err(CliError::Other(_)))));
        assert_eq!(
            std::fs::read_to_string(dir.join("keep")).ok().as_deref(),
            Some("mine")
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
