//! `ddp-verify compare A B`: two traces recorded elsewhere (a user's own loop through the
//! `ddp_verify_trace` recorder, or `--save-trace`), judged and reported like a run.

use crate::error::{Exit, Result};
use crate::evidence::Legs;
use crate::judge::{Outcome, Terms};
pub use crate::spec::CompareOptions;

pub fn command(opts: &CompareOptions) -> Result<Exit> {
    let outcome = judge_traces(opts)?;
    crate::report::write_all(&outcome, &opts.reports)?;
    Ok(outcome.exit())
}

/// Reads the traces (and the big batch's), lines them up, and judges them.
pub fn judge_traces(opts: &CompareOptions) -> Result<Outcome> {
    let legs = Legs::load(
        &opts.paths,
        opts.big.as_deref(),
        opts.control.as_deref(),
        [opts.precision.as_deref(), opts.precision_ddp.as_deref()],
    )?;
    Ok(crate::judge::judge(legs, Terms::Traces(opts)))
}
