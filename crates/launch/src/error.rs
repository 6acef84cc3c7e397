//! What can go wrong while starting or watching the ranks (exit code 3). The main crate's
//! error type takes these in as they are.

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("launcher: {problem}; {fix}")]
    Launcher { problem: String, fix: String },

    #[error("rank {rank}: {problem}")]
    Rank { rank: usize, problem: String },

    #[error("{context}: {source}")]
    Io { context: String, source: std::io::Error },

    /// A signal asked us to stop (Ctrl-C, TERM, HUP, QUIT); every rank was stopped first.
    #[error("interrupted by signal {signal}; every rank was stopped")]
    Interrupted { signal: i32 },
}

pub type Result<T, E = LaunchError> = std::result::Result<T, E>;

impl LaunchError {
    /// 128 + the signal for an interruption, as a shell reports it (130 for Ctrl-C); else 3.
    pub fn exit(&self) -> crate::Exit {
        match self {
            LaunchError::Interrupted { signal } => crate::Exit::Interrupted { signal: *signal },
            _ => crate::Exit::Failed,
        }
    }

    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        LaunchError::Io { context: context.into(), source }
    }
}
