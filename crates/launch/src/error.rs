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
}

pub type Result<T, E = LaunchError> = std::result::Result<T, E>;

impl LaunchError {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        LaunchError::Io { context: context.into(), source }
    }
}
