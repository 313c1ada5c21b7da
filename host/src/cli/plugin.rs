//! `wasmop` as a kubectl plugin: the name it was started under (`kubectl-wasmop`,
//! `kubectl_complete-wasmop`), `wasmop plugin install`, `wasmop completion SHELL`, and the
//! completion protocol kubectl (1.26 and later) speaks to a plugin's `kubectl_complete-NAME`.
//!
//! # Guarantees
//! - One binary: the links `wasmop plugin install` makes point at the running executable, and
//!   what a link does is decided by its file name ([`Invocation::detect`]) alone.
//! - The completions offered are the command line's own subcommands and flags (from clap's
//!   [`clap::Command`] tree), so they cannot drift from what the parser accepts.
//!
//! # Caveats
//! kubectl's plugin completion completes subcommands and flag names, not flag values; after a
//! subcommand's non-flag word it leaves the shell to complete file names.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::CommandFactory as _;

use super::{Cli, CliError};

/// The file name of the kubectl plugin link.
pub const PLUGIN: &str = "kubectl-wasmop";
/// The file name kubectl runs to complete `kubectl wasmop ...`.
pub const COMPLETER: &str = "kubectl_complete-wasmop";

/// How the binary was started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Invocation {
    /// As `wasmop` (or any other name).
    Wasmop,
    /// As `kubectl-wasmop`, that is `kubectl wasmop`.
    Kubectl,
    /// As `kubectl_complete-wasmop`: answer kubectl's completion request.
    KubectlComplete,
}

impl Invocation {
    /// Decides from argv[0]'s file name (an `.exe` suffix ignored).
    pub fn detect(argv0: Option<&std::ffi::OsStr>) -> Invocation {
        let name = argv0
            .map(Path::new)
            .and_then(Path::file_name)
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        match name.strip_suffix(".exe").unwrap_or(&name) {
            PLUGIN => Invocation::Kubectl,
            COMPLETER => Invocation::KubectlComplete,
            _ => Invocation::Wasmop,
        }
    }

    /// The name help and usage show: `kubectl wasmop` under kubectl.
    pub fn bin_name(self) -> &'static str {
        match self {
            Invocation::Wasmop => "wasmop",
            Invocation::Kubectl | Invocation::KubectlComplete => "kubectl wasmop",
        }
    }
}

/// Arguments of `completion`.
#[derive(Debug, clap::Args)]
pub struct CompletionArgs {
    /// The shell.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// Arguments of `plugin`.
#[derive(Debug, clap::Args)]
pub struct PluginArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: PluginCommand,
}

/// The subcommands of `plugin`.
#[derive(Debug, clap::Subcommand)]
pub enum PluginCommand {
    /// Link `kubectl-wasmop` and `kubectl_complete-wasmop` to this binary, so that
    /// `kubectl wasmop ...` runs it and kubectl completes its subcommands.
    Install(InstallArgs),
}

/// Arguments of `plugin install`.
#[derive(Debug, clap::Args)]
pub struct InstallArgs {
    /// The directory for the links, one on PATH (default: the directory of this binary).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Replace files of those names that are not already links to this binary.
    #[arg(long)]
    pub force: bool,
}

/// Prints the completion script of `shell` for the name the binary was started under.
pub fn completion(args: &CompletionArgs, invocation: Invocation) -> ExitCode {
    let bin = match invocation {
        Invocation::Wasmop => "wasmop",
        Invocation::Kubectl | Invocation::KubectlComplete => PLUGIN,
    };
    if invocation != Invocation::Wasmop {
        eprintln!(
            "(this completes `{PLUGIN}`; `kubectl wasmop <TAB>` is completed by kubectl 1.26+ \
             through {COMPLETER}, which `wasmop plugin install` links)"
        );
    }
    let mut cmd = Cli::command();
    clap_complete::generate(args.shell, &mut cmd, bin, &mut std::io::stdout());
    ExitCode::SUCCESS
}

/// Runs `plugin install`.
///
/// # Errors
/// [`CliError::Other`] when this binary's path is unknown or a link cannot be made, or a file
/// of that name is in the way (without --force).
pub fn run(args: PluginArgs) -> Result<ExitCode, CliError> {
    let PluginCommand::Install(args) = args.command;
    let exe = std::env::current_exe()
        .and_then(std::fs::canonicalize)
        .map_err(|e| CliError::Other(format!("cannot find this binary's path: {e}")))?;
    let dir = match args.dir {
        Some(dir) => dir,
        None => exe
            .parent()
            .map(Path::to_path_buf)
            .ok_or_else(|| CliError::Other("this binary has no directory; pass --dir".into()))?,
    };
    for name in [PLUGIN, COMPLETER] {
        link(&exe, &dir.join(name), args.force)?;
    }
    let on_path = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| same_dir(&d, &dir)));
    if !on_path {
        eprintln!(
            "note: {} is not on PATH; kubectl finds plugins on PATH only",
            dir.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn same_dir(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// Makes `at` a symbolic link to `exe`, leaving one that already is in place.
fn link(exe: &Path, at: &Path, force: bool) -> Result<(), CliError> {
    let fail = |e: std::io::Error| CliError::Io {
        action: "cannot link",
        path: at.to_path_buf(),
        source: e,
    };
    if let Ok(meta) = std::fs::symlink_metadata(at) {
        if std::fs::canonicalize(at).is_ok_and(|t| t == exe) {
            println!("{} already links to {}", at.display(), exe.display());
            return Ok(());
        }
        if !force {
            return Err(CliError::Other(format!(
                "{} exists and is not a link to {} (a {}); pass --force to replace it",
                at.display(),
                exe.display(),
                if meta.is_symlink() {
                    "link elsewhere"
                } else {
                    "file"
                }
            )));
        }
        std::fs::remove_file(at).map_err(fail)?;
    }
    symlink(exe, at).map_err(fail)?;
    println!("{} -> {}", at.display(), exe.display());
    Ok(())
}

#[cfg(unix)]
fn symlink(exe: &Path, at: &Path) -> std::io::Result<()> {
    std::os::unix::fs::symlink(exe, at)
}

#[cfg(not(unix))]
fn symlink(exe: &Path, at: &Path) -> std::io::Result<()> {
    std::fs::copy(exe, at).map(|_| ())
}

/// Answers kubectl's completion request: `words` are the words after `kubectl wasmop`, the
/// last one the word being completed (maybe empty). Prints one candidate a line
/// (`name<TAB>description`), then `:DIRECTIVE` as cobra's `__complete` does: 4 (no file
/// completion) when there are candidates, 0 (the shell's default, file names) otherwise.
pub fn kubectl_complete(words: &[String]) -> ExitCode {
    let mut cmd = Cli::command();
    cmd.build();
    let (current, before) = words
        .split_last()
        .map_or(("", &[][..]), |(c, b)| (c.as_str(), b));
    let mut at = &cmd;
    for word in before.iter().filter(|w| !w.starts_with('-')) {
        match at.find_subcommand(word) {
            Some(sub) => at = sub,
            None => break,
        }
    }
    let candidates = candidates(at, current);
    let mut out = std::io::stdout().lock();
    for (name, about) in &candidates {
        let _ = writeln!(out, "{name}\t{about}");
    }
    let directive = if candidates.is_empty() { 0 } else { 4 };
    let _ = writeln!(out, ":{directive}");
    ExitCode::SUCCESS
}

/// The subcommands (or, for a word starting with `-`, the long flags) of `cmd` that start with
/// `prefix`, with their one-line help.
fn candidates(cmd: &clap::Command, prefix: &str) -> Vec<(String, String)> {
    let about = |s: Option<&clap::builder::StyledStr>| {
        s.map(|s| s.to_string().lines().next().unwrap_or_default().to_string())
            .unwrap_or_default()
    };
    let all: Vec<(String, String)> = if prefix.starts_with('-') {
        cmd.get_arguments()
            .filter(|a| !a.is_hide_set())
            .filter_map(|a| Some((format!("--{}", a.get_long()?), about(a.get_help()))))
            .collect()
    } else {
        cmd.get_subcommands()
            .filter(|s| !s.is_hide_set())
            .map(|s| (s.get_name().to_string(), about(s.get_about())))
            .collect()
    };
    all.into_iter()
        .filter(|(name, _)| name.starts_with(prefix))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_name_decides_the_invocation() {
        let detect = |s: &str| Invocation::detect(Some(std::ffi::OsStr::new(s)));
        assert_eq!(detect("/usr/local/bin/kubectl-wasmop"), Invocation::Kubectl);
        assert_eq!(
            detect("kubectl_complete-wasmop"),
            Invocation::KubectlComplete
        );
        assert_eq!(detect("kubectl-wasmop.exe"), Invocation::Kubectl);
        assert_eq!(detect("/opt/wasmop"), Invocation::Wasmop);
        assert_eq!(detect("kubectl-wasmopx"), Invocation::Wasmop);
        assert_eq!(Invocation::detect(None), Invocation::Wasmop);
    }

    #[test]
    fn completion_offers_subcommands_then_their_flags() {
        let mut cmd = Cli::command();
        cmd.build();
        let names = |c: &clap::Command, p: &str| -> Vec<String> {
            candidates(c, p).into_iter().map(|(n, _)| n).collect()
        };
        assert_eq!(names(&cmd, "di"), ["diff"]);
        let diff = cmd.find_subcommand("diff").expect("diff");
        let flags = names(diff, "--c");
        assert!(flags.contains(&"--context".to_string()), "{flags:?}");
        assert!(names(&cmd, "zzz").is_empty());
    }
}
