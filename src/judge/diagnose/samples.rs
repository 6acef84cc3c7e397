//! Samples: which samples, counted how, made the first differing step, where no factor
//! explains it.

use super::{Diagnosis, Evidence, Loss};
use crate::judge::Reason;

/// The same samples in every step yet more than rounding apart, and not by one factor: a
/// count is off by whole tokens, percents of it (the same samples regrouped, a bug that only
/// reorders sums, differ by rounding).
pub fn token_count_per_rank(ev: &Evidence) -> Option<Diagnosis> {
    let s = ev.first?;
    let cx = ev.cx;
    if cx.loss != Loss::PerToken || cx.same_samples != Some(true) || ev.c.steps[s].max_rel <= 1e-3 {
        return None;
    }
    Diagnosis::new(
        Reason::TokenCountPerRank,
        format!(
            "the runs see the same samples in every step, yet step {s} differs by more than rounding and not by one \
             factor: they divide by different token counts; each rank must divide by the step's count over all \
             ranks (all-reduce it before backward), not by its own"
        ),
    )
}

/// The first difference comes in a later epoch: the shuffle differs between epochs.
pub fn epoch(ev: &Evidence) -> Option<Diagnosis> {
    let s = ev.first?;
    let epoch = ev.cx.steps_per_epoch.map_or(0, |n| s / n.max(1));
    (epoch > 0).then(|| Diagnosis {
        reason: Reason::EpochDependentSampling,
        located: None,
        detail: format!(
            "the runs agree through epoch {} and first differ in epoch {epoch} (step {s}): the shuffle differs \
             between epochs; is set_epoch(epoch) called on every rank's sampler?",
            epoch - 1
        ),
    })
}

/// What is left: other samples in the step.
pub fn different_samples(ev: &Evidence) -> Option<Diagnosis> {
    let s = ev.first?;
    Diagnosis::new(
        Reason::DifferentSamples,
        format!(
            "step {s} differs by more than rounding and not by a constant factor: the runs likely see different \
             samples in that step (strided vs contiguous split, padding)"
        ),
    )
}
