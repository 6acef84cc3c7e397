//! Parsed flags → the command that runs them, for the commands that need no libtorch
//! (`compare`, `split`, `-- COMMAND`, `explore -- COMMAND`): `ddp-verify-core` and the wheel's `ddp-verify` both
//! run them from here, so a user's trace is judged by one code path whichever is installed.

use ddp_verify_cli::{Cli, Command};

use crate::error::{Exit, Result};
use crate::jobs;
use crate::lower;

pub use crate::error::NEEDS_LIBTORCH;

/// Test hook (`DDP_VERIFY_TEST_VALIDATE_ONLY=1`): stop after every check made before a
/// rank starts, so the flag fuzzer covers parsing, lowering and validation without training.
pub fn validate_only() -> bool {
    std::env::var_os("DDP_VERIFY_TEST_VALIDATE_ONLY").is_some()
}

/// Runs `cli` where its command needs no libtorch; `None` for the others.
pub fn without_libtorch(cli: &Cli) -> Option<Result<Exit>> {
    Some(match &cli.command {
        Some(Command::Split(args)) => {
            lower::split(args).and_then(|(train, epoch)| jobs::split(&train, epoch, args.json))
        }
        Some(Command::Compare(args)) => lower::compare(args).and_then(|o| jobs::compare::command(&o)),
        // A suite of a user's script's cases needs no libtorch; without it, every suite is
        // read as one (ddp-verify's own models' cases are refused there, naming the build).
        Some(Command::Suite(args)) if !cfg!(feature = "libtorch") || lower::is_script_suite(&args.file) => {
            lower::script_suite(args).and_then(|o| match validate_only() {
                true => Ok(Exit::Equivalent),
                false => jobs::script_suite::command(&o),
            })
        }
        Some(Command::Watch(args)) => lower::watch(args).and_then(|o| match validate_only() {
            true => Ok(Exit::Equivalent),
            false => jobs::watch::command(&o),
        }),
        Some(Command::Explore(args)) if !args.script.is_empty() => {
            lower::explore::script(args).and_then(|o| match validate_only() {
                true => Ok(Exit::Equivalent),
                false => jobs::explore::script::command(&o),
            })
        }
        None if !cli.run.script.is_empty() => lower::script(&cli.run).and_then(|o| match validate_only() {
            true => Ok(Exit::Equivalent),
            false => jobs::script::command(&o),
        }),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    /// The wheel, the recorder and `ddp-verify --version` say one version.
    #[test]
    fn the_python_package_has_the_crates_version() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let version = format!("\"{}\"", env!("CARGO_PKG_VERSION"));
        for (file, key) in
            [("python/pyproject.toml", "version = "), ("python/ddp_verify_trace/__init__.py", "__version__ = ")]
        {
            let text = std::fs::read_to_string(root.join(file)).unwrap();
            assert!(text.lines().any(|l| l == format!("{key}{version}")), "{file} does not say {key}{version}");
        }
    }
}
