//! `wasmop new NAME [--lang rust] [--kind KIND] [--group GROUP] [--dir DIR] [--sdk-path DIR]`:
//! scaffold a module project that builds and passes `wasmop test` out of the box.
//!
//! The project holds the reconciler skeleton (`src/lib.rs`), its build settings (`Cargo.toml`,
//! `rust-toolchain.toml`), a fixture and its golden file (`fixtures/`), the cluster side (`k8s/`:
//! a CRD from a small schema, RBAC, the WasmReconciler) and a README.
//!
//! # Extension point: other languages
//! A language is a [`Lang`] variant and a [`Template`] (a list of files with `{{placeholders}}`,
//! embedded with `include_str!`). Python joins with its own template directory once its SDK
//! exists; [`render`] and [`write_project`] are language-neutral.
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
    /// Depend on the SDK at this path (a wasmop checkout's `guest-sdk`) instead of wasmop's git
    /// repository.
    #[arg(long)]
    pub sdk_path: Option<PathBuf>,
}

/// The languages `wasmop new` scaffolds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    /// Rust, with the `wasmop-sdk` crate.
    Rust,
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

/// The SDK dependency a project gets without `--sdk-path`.
const SDK_FROM_GIT: &str = r#"wasmop-sdk = { git = "https://github.com/wasmop/wasmop" }"#;

impl Lang {
    fn template(self) -> Template {
        match self {
            Lang::Rust => RUST,
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
        let sdk_dependency = match &args.sdk_path {
            Some(path) => format!(
                "wasmop-sdk = {{ path = {:?} }}",
                path.to_string_lossy().as_ref()
            ),
            None => SDK_FROM_GIT.to_string(),
        };
        Ok(Names {
            name: name.to_string(),
            krate: name.replace('-', "_"),
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
        let path = dir.join(relative);
        let write = |source| CliError::Io {
            action: "cannot write",
            path: path.clone(),
            source,
        };
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(write)?;
        }
        std::fs::write(&path, render(text, names)).map_err(write)?;
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
    let wasm = format!("target/wasm32-wasip2/release/{}.wasm", names.krate);
    eprintln!(
        "created {} ({} {} in {}/v1)\nnext:\n  cd {}\n  cargo build --release --target wasm32-wasip2\n  wasmop test {wasm} --reconciler {} --object fixtures/cr.yaml --expect fixtures/expected.yaml",
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
        for (path, text) in RUST {
            let rendered = names.as_ref().map(|n| render(text, n)).unwrap_or_default();
            assert!(!rendered.contains("{{"), "{path} keeps a placeholder");
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
