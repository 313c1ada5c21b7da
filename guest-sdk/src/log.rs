//! Logging to the host.
//!
//! In a module, lines go to the host's log (tracing), tagged with the module's name and the object
//! being reconciled. Natively (unit tests), they go to stderr, and the testing harness collects
//! them.

use std::fmt;

/// How important a line is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Very detailed.
    Trace,
    /// For developers.
    Debug,
    /// Normal operation.
    Info,
    /// Something odd that the module recovered from.
    Warn,
    /// Something failed.
    Error,
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Level::Trace => "TRACE",
            Level::Debug => "DEBUG",
            Level::Info => "INFO",
            Level::Warn => "WARN",
            Level::Error => "ERROR",
        })
    }
}

/// Writes one line at `level`.
pub fn log(level: Level, message: &str) {
    #[cfg(target_family = "wasm")]
    {
        use crate::__bindings::wasmop::reconciler::host::{self, LogLevel};
        let level = match level {
            Level::Trace => LogLevel::Trace,
            Level::Debug => LogLevel::Debug,
            Level::Info => LogLevel::Info,
            Level::Warn => LogLevel::Warn,
            Level::Error => LogLevel::Error,
        };
        host::log(level, message);
    }
    #[cfg(not(target_family = "wasm"))]
    {
        native::log(level, message);
    }
}

/// Writes a line at trace level.
pub fn trace(message: impl AsRef<str>) {
    log(Level::Trace, message.as_ref());
}
/// Writes a line at debug level.
pub fn debug(message: impl AsRef<str>) {
    log(Level::Debug, message.as_ref());
}
/// Writes a line at info level.
pub fn info(message: impl AsRef<str>) {
    log(Level::Info, message.as_ref());
}
/// Writes a line at warn level.
pub fn warn(message: impl AsRef<str>) {
    log(Level::Warn, message.as_ref());
}
/// Writes a line at error level.
pub fn error(message: impl AsRef<str>) {
    log(Level::Error, message.as_ref());
}

#[cfg(not(target_family = "wasm"))]
pub(crate) mod native {
    use super::Level;
    use std::cell::RefCell;

    thread_local! {
        /// Lines collected by the testing harness, when it is collecting.
        static CAPTURE: RefCell<Option<Vec<(Level, String)>>> = const { RefCell::new(None) };
    }

    pub(crate) fn log(level: Level, message: &str) {
        let captured = CAPTURE.with(|c| {
            c.borrow_mut()
                .as_mut()
                .map(|lines| lines.push((level, message.to_string())))
                .is_some()
        });
        if !captured {
            eprintln!("[module {level}] {message}");
        }
    }

    /// Runs `f`, collecting the lines it logs.
    #[allow(dead_code)]
    pub(crate) fn capture<T>(f: impl FnOnce() -> T) -> (T, Vec<(Level, String)>) {
        CAPTURE.with(|c| *c.borrow_mut() = Some(Vec::new()));
        let out = f();
        let lines = CAPTURE.with(|c| c.borrow_mut().take()).unwrap_or_default();
        (out, lines)
    }
}
