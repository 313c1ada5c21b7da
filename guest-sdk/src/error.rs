//! The error a module returns.

use std::fmt;

/// A module's failure, shown to users as a Warning Event on the primary (the host retries with
/// backoff). Build one with [`Error::msg`], or let `?` convert a serde error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    message: String,
}

/// `Result` with the SDK's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An error with this message.
    pub fn msg(message: impl fmt::Display) -> Self {
        Error {
            message: message.to_string(),
        }
    }

    /// Adds context in front of the message: `context: message`.
    pub fn context(self, context: impl fmt::Display) -> Self {
        Error {
            message: format!("{context}: {}", self.message),
        }
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        Error::msg(e)
    }
}

impl From<String> for Error {
    fn from(message: String) -> Self {
        Error { message }
    }
}

impl From<&str> for Error {
    fn from(message: &str) -> Self {
        Error::msg(message)
    }
}
