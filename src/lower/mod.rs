//! Flags → one validated configuration, a file per command: the main command (`verify.rs`:
//! our models' verification; `script.rs`: `-- COMMAND`), `compare.rs`, `split.rs`,
//! [`explore`] (both its subjects) and `suite.rs` (both kinds of suite file); `kernels.rs`
//! holds `--kernels`, which every command that computes takes. Values' names and `--timeout` are checked while
//! parsing (`crates/cli`); every other check of the flags happens here, once, and what needs
//! nothing but the flags may run on every rank (they fail alike everywhere);
//! [`crate::jobs::preflight`] checks what depends on the machine (files, memory, the CI
//! variable) in one process only, before any training. The stages below receive plain,
//! valid data. Only what needs libtorch is built with it: our models' verification and
//! suites (the device resolved, goldens' kernels), and the kernel mode (a golden's vendor).

use ddp_verify_cli::{ReportArgs, SplitShape, ToleranceArgs};

use crate::error::{Error, Result};
use crate::spec::{Dtype, Format, ReportTarget, Shape, Tolerance, ToleranceOverrides};

mod compare;
pub mod explore;
#[cfg(feature = "libtorch")]
mod kernels;
mod script;
mod split;
mod suite;
#[cfg(feature = "libtorch")]
mod verify;
mod watch;

pub use compare::compare;
#[cfg(feature = "libtorch")]
pub use kernels::kernel_mode;
pub use script::script;
pub use split::split;
#[cfg(feature = "libtorch")]
pub use suite::suite;
pub use suite::{is_script_suite, script_suite};
#[cfg(feature = "libtorch")]
pub use verify::verification;
pub use watch::watch;

/// `--report FORMAT [--report-file PATH]...`, paired by position; the table on stdout by default.
pub fn reports(args: &ReportArgs) -> Result<Vec<ReportTarget>> {
    if args.report_file.len() > args.report.len().max(1) {
        return Err(Error::bad_flag(
            "--report-file",
            format!("{} files for {} --report formats", args.report_file.len(), args.report.len()),
            "give one --report FORMAT for each --report-file, in the same order",
        ));
    }
    let formats = match args.report.is_empty() {
        true => vec![Format::Table],
        false => args.report.clone(),
    };
    Ok(formats
        .iter()
        .enumerate()
        .map(|(i, &format)| ReportTarget { format, path: args.report_file.get(i).cloned() })
        .collect())
}

fn overrides(t: &ToleranceArgs) -> ToleranceOverrides {
    ToleranceOverrides { max_ulps: t.max_ulps, rtol: t.rtol, atol: t.atol }
}

/// `--max-ulps/--rtol/--atol` checked for every dtype (explore and compare meet any).
fn checked_overrides(t: &ToleranceArgs) -> Result<ToleranceOverrides> {
    let o = overrides(t);
    for dtype in Dtype::ALL {
        check_tolerance(&o.tolerance(dtype, false))?;
    }
    Ok(o)
}

fn shape(s: &SplitShape) -> Shape {
    Shape {
        data_size: s.data_size,
        seed: s.seed,
        batch_size: s.batch_size,
        acc_steps: s.acc_steps,
        gpus: s.gpus,
        shuffle: s.shuffle,
        drop_last: s.drop_last,
    }
}

/// `--rtol` and `--atol`: finite and not negative.
fn check_tolerance(t: &Tolerance) -> Result<()> {
    for (flag, v) in [("--rtol", t.rtol), ("--atol", t.atol)] {
        if !v.is_finite() || v < 0.0 {
            return Err(Error::bad_flag(flag, format!("{v} is not a finite non-negative number"), "pass e.g. 1e-6"));
        }
    }
    Ok(())
}
