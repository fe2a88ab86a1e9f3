//! The backend's errors.

/// What went wrong talking to iptables.
#[derive(Debug, thiserror::Error)]
pub enum IptablesError {
    /// A command could not be started or fed.
    #[error("cannot run {program}")]
    Spawn {
        /// The command.
        program: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// `iptables-save`, or the listing of a chain, failed.
    #[error("{program} failed: {stderr}")]
    Save {
        /// The command.
        program: String,
        /// What it said.
        stderr: String,
    },
    /// `iptables-restore` refused the input: nothing of the refused table was applied.
    #[error("{program} refused the rules{}: {stderr}", match (line, text) {
        (Some(n), Some(t)) => format!(" at input line {n} ({t:?})"),
        (Some(n), None) => format!(" at input line {n}"),
        _ => String::new(),
    })]
    Restore {
        /// The command.
        program: String,
        /// The input line it named.
        line: Option<usize>,
        /// That line's text.
        text: Option<String>,
        /// What it said.
        stderr: String,
    },
    /// The options contradict each other.
    #[error("{0}")]
    Options(String),
    /// An injected failure (the in-memory kernel).
    #[error("injected failure: {0}")]
    Injected(String),
}

impl IptablesError {
    /// As the error the runner handles.
    pub fn into_backend_error(self) -> kpng_backend::BackendError {
        kpng_backend::BackendError::new(crate::NAME, "applying iptables rules").with_source(self)
    }
}
