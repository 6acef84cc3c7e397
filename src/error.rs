//! One error type for the library. Each variant maps to a documented exit code, and its
//! message is a single line that names the flag or file and says how to fix it.

use std::path::PathBuf;

pub use ddp_verify_cli::Exit;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    // --- bad usage or input (exit 2) ---
    #[error("{flag}: {problem}; {fix}")]
    BadFlag { flag: &'static str, problem: String, fix: String },

    #[error("{}: {problem}; {fix}", path.display())]
    BadFile { path: PathBuf, problem: String, fix: String },

    // --- a rank or the launcher failed (exit 3) ---
    #[error("launcher: {problem}; {fix}")]
    Launcher { problem: String, fix: String },

    #[error("rank {rank}: {problem}")]
    Rank { rank: usize, problem: String },

    /// A rank other than 0 stopped because rank 0 refused the input and reports why.
    #[error("stopped because rank 0 refused the configuration")]
    FollowerStopped,

    #[cfg(feature = "libtorch")]
    #[error("libtorch: {0}")]
    Torch(tch::TchError),

    #[error("{context}: {source}")]
    Io { context: String, source: std::io::Error },

    /// A signal stopped the run; every rank was stopped first (exit 128 + the signal).
    #[error("interrupted by signal {signal}; every rank was stopped")]
    Interrupted { signal: i32 },
}

/// What a build without libtorch says of the commands that train our own models (exit 2).
pub const NEEDS_LIBTORCH: &str = "this ddp-verify (the pip package, built without libtorch) runs compare, split, \
     -- COMMAND, explore -- COMMAND and suites of your script's cases only; training ddp-verify's own models needs the full build: in a clone of the ddp-verify \
     repository run ./scripts/setup.sh && cargo build (README, first section)";

/// What stands at `path`, in words, when it is not the regular file (or directory) asked
/// for: "does not exist", "is a directory", or what else it is.
pub fn what_is(path: &std::path::Path) -> &'static str {
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => "does not exist",
        Err(_) => "cannot be read",
        Ok(m) if m.is_dir() => "is a directory",
        Ok(m) if m.is_file() => "is a regular file",
        Ok(_) => "is not a regular file (a device, pipe or socket)",
    }
}

#[cfg(feature = "libtorch")]
impl From<tch::TchError> for Error {
    /// An operation without a deterministic CUDA kernel is a limit of the input (the model on
    /// that device), not a failure: exit 2 with libtorch's own first line.
    fn from(e: tch::TchError) -> Self {
        let text = e.to_string();
        match text.find("does not have a deterministic implementation") {
            Some(_) => Error::bad_flag(
                "--device",
                format!(
                    "{} (ddp-verify runs CUDA with deterministic kernels only, so that equal inputs give equal bits)",
                    text.lines().next().unwrap_or_default().trim()
                ),
                "run this model with --device cpu",
            ),
            None => Error::Torch(e),
        }
    }
}

impl From<ddp_verify_launch::LaunchError> for Error {
    fn from(e: ddp_verify_launch::LaunchError) -> Self {
        use ddp_verify_launch::LaunchError as L;
        match e {
            L::Launcher { problem, fix } => Error::Launcher { problem, fix },
            L::Rank { rank, problem } => Error::Rank { rank, problem },
            L::Io { context, source } => Error::Io { context, source },
            L::Interrupted { signal } => Error::Interrupted { signal },
        }
    }
}

impl Error {
    /// Exit codes: 0 equivalent, 1 not equivalent (not an error), 2 bad usage or input,
    /// 3 a rank or the launcher failed.
    pub fn exit(&self) -> Exit {
        match self {
            Error::BadFlag { .. } | Error::BadFile { .. } | Error::FollowerStopped => Exit::BadInput,
            Error::Launcher { .. } | Error::Rank { .. } | Error::Io { .. } => Exit::Failed,
            #[cfg(feature = "libtorch")]
            Error::Torch(_) => Exit::Failed,
            Error::Interrupted { signal } => Exit::Interrupted { signal: *signal },
        }
    }

    /// Under mpirun every rank meets the same bad input; rank 0 alone reports it.
    pub fn reported_by(&self, rank: Option<usize>) -> bool {
        match self {
            Error::FollowerStopped => false,
            Error::BadFlag { .. } | Error::BadFile { .. } => rank.unwrap_or(0) == 0,
            _ => true,
        }
    }

    pub fn bad_flag(flag: &'static str, problem: impl Into<String>, fix: impl Into<String>) -> Self {
        Error::BadFlag { flag, problem: problem.into(), fix: fix.into() }
    }

    pub fn bad_file(path: impl Into<PathBuf>, problem: impl Into<String>, fix: impl Into<String>) -> Self {
        Error::BadFile { path: path.into(), problem: problem.into(), fix: fix.into() }
    }

    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io { context: context.into(), source }
    }
}
