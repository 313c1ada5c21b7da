//! Control-plane processes and the guarantee that none outlives its owner.
//!
//! Every component runs in a process group of its own, with stdout and stderr in a log file.
//! A [`Reaper`] (a tiny `sh` in yet another process group) is told each group as it starts and
//! holds the read end of a pipe whose write end only this process has: when this process ends
//! for any reason (normal exit, panic, Ctrl-C, SIGKILL), the pipe closes and the reaper sends
//! SIGTERM, then SIGKILL, to every group (etcd last), and removes the cluster's temporary
//! directory unless a failing test asked to keep it.

use std::fs::File;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use crate::error::{Error, Result};

/// The file whose presence in the cluster directory keeps it (and its logs) after teardown.
pub const KEEP_MARKER: &str = "KEEP";

// The first group registered is etcd: it is stopped after the others (as `ControlPlane`'s drop
// does), because a kube-apiserver whose etcd goes away while it shuts down ignores SIGTERM until
// it is SIGKILLed. A group whose leader is a zombie is gone (only init has yet to reap it).
const REAPER_SCRIPT: &str = r#"
dir="$1"; first=""; rest=""
while read -r g; do
  if [ -z "$first" ]; then first="$g"; else rest="$g $rest"; fi
done
running() {
  kill -0 "-$1" 2>/dev/null || return 1
  case "$(cat "/proc/$1/stat" 2>/dev/null)" in *") Z "*) return 1 ;; esac
}
stop() {
  for g in "$@"; do kill -TERM "-$g" 2>/dev/null; done
  i=0
  while [ "$i" -lt 50 ]; do
    alive=0
    for g in "$@"; do running "$g" && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1; i=$((i+1))
  done
}
stop $rest
stop $first
for g in $first $rest; do kill -KILL "-$g" 2>/dev/null; done
[ -e "$dir/KEEP" ] || rm -rf "$dir"
"#;

/// Kills every registered process group when this process ends, however it ends.
#[derive(Debug)]
pub struct Reaper {
    pipe: ChildStdin,
    child: Child,
}

impl Reaper {
    /// Starts the reaper for the cluster directory `dir`.
    ///
    /// # Errors
    /// [`Error::Spawn`] if `sh` cannot be started.
    pub fn start(dir: &Path) -> Result<Self> {
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(REAPER_SCRIPT)
            .arg("wasmop-testenv-reaper")
            .arg(dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Its own group: a Ctrl-C in the terminal must not kill it before it cleans up.
            .process_group(0)
            .spawn()
            .map_err(|source| Error::Spawn {
                component: "reaper",
                binary: "sh".into(),
                source,
            })?;
        let pipe = child.stdin.take().ok_or_else(|| Error::Spawn {
            component: "reaper",
            binary: "sh".into(),
            source: std::io::Error::other("no stdin pipe"),
        })?;
        Ok(Reaper { pipe, child })
    }

    /// Registers a process group to kill when this process ends.
    fn watch(&mut self, pgid: u32) {
        // If the reaper is gone there is nothing better to do: Drop still kills the group.
        let _ = writeln!(self.pipe, "{pgid}");
        let _ = self.pipe.flush();
    }

    /// Closes the pipe (the reaper then cleans up) and waits for it to finish.
    pub fn finish(self) {
        let Reaper { pipe, mut child } = self;
        drop(pipe);
        let _ = child.wait();
    }
}

/// A running control-plane component.
#[derive(Debug)]
pub struct Process {
    /// The component's name, e.g. `kube-apiserver`.
    pub name: &'static str,
    /// Its log file (stdout and stderr).
    pub log: PathBuf,
    binary: PathBuf,
    args: Vec<String>,
    child: Child,
}

impl Process {
    /// Starts `binary` with `args` in a new process group registered with `reaper`.
    ///
    /// # Errors
    /// [`Error::Spawn`] if it cannot be started, [`Error::Io`] if its log cannot be created.
    pub fn spawn(
        name: &'static str,
        binary: &Path,
        args: &[String],
        log_dir: &Path,
        reaper: &mut Reaper,
    ) -> Result<Self> {
        let log = log_dir.join(format!("{name}.log"));
        let out = File::create(&log).map_err(Error::io("creating", &log))?;
        let child = launch(name, binary, args, out, reaper)?;
        Ok(Process {
            name,
            log,
            binary: binary.into(),
            args: args.to_vec(),
            child,
        })
    }

    /// Kills the group with SIGKILL (a crash: no graceful shutdown) and reaps the child.
    pub fn kill(&mut self) {
        let pgid = Pid::from_raw(i32::try_from(self.child.id()).unwrap_or(i32::MAX));
        let _ = killpg(pgid, Signal::SIGKILL);
        let _ = self.child.wait();
    }

    /// Starts the component again with the same binary and arguments (after [`Process::kill`]
    /// or an exit), appending to its log, in a new process group registered with `reaper`.
    ///
    /// # Errors
    /// [`Error::Spawn`] if it is still running or cannot be started, [`Error::Io`] if its log
    /// cannot be opened.
    pub fn respawn(&mut self, reaper: &mut Reaper) -> Result<()> {
        if matches!(self.child.try_wait(), Ok(None)) {
            return Err(Error::Spawn {
                component: self.name,
                binary: self.binary.clone(),
                source: std::io::Error::other("it is still running; kill it first"),
            });
        }
        let mut out = File::options()
            .append(true)
            .open(&self.log)
            .map_err(Error::io("opening", &self.log))?;
        let _ = writeln!(out, "---- wasmop-testenv: restarting {} ----", self.name);
        self.child = launch(self.name, &self.binary, &self.args, out, reaper)?;
        Ok(())
    }

    /// Fails if the process has exited, with the tail of its log.
    ///
    /// # Errors
    /// [`Error::Exited`] if it is no longer running.
    pub fn check_running(&mut self) -> Result<()> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(Error::Exited {
                component: self.name,
                status: status.to_string(),
                log: self.log.clone(),
                tail: tail(&self.log, 25),
            }),
            Err(e) => Err(Error::Exited {
                component: self.name,
                status: e.to_string(),
                log: self.log.clone(),
                tail: tail(&self.log, 25),
            }),
        }
    }

    /// Sends SIGTERM to the group, waits up to `grace`, then SIGKILLs it and reaps the child.
    pub fn stop(&mut self, grace: Duration) {
        let pgid = Pid::from_raw(i32::try_from(self.child.id()).unwrap_or(i32::MAX));
        let _ = killpg(pgid, Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        // Also kills anything the component started and left in its group.
        let _ = killpg(pgid, Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

/// Starts `binary` in a new process group writing to `out`, and registers the group.
fn launch(
    name: &'static str,
    binary: &Path,
    args: &[String],
    out: File,
    reaper: &mut Reaper,
) -> Result<Child> {
    let err = out.try_clone().map_err(|source| Error::Spawn {
        component: name,
        binary: binary.into(),
        source,
    })?;
    let child = Command::new(binary)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .spawn()
        .map_err(|source| Error::Spawn {
            component: name,
            binary: binary.into(),
            source,
        })?;
    reaper.watch(child.id());
    Ok(child)
}

impl Drop for Process {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.stop(Duration::from_secs(10));
        }
    }
}

/// The last `lines` lines of a text file (empty if it cannot be read).
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
