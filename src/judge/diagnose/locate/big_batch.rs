//! Accumulation against one big batch of each step's samples: where DDP agrees with
//! accumulation, a mismatch here is a normalisation both runs share (a per-micro-batch mean,
//! a wrong count), not a sampler's. The most specific shape first.

use crate::judge::diagnose::measure::factor::fitted_ratio;
use crate::judge::diagnose::measure::legs::Leg;
use crate::judge::diagnose::measure::{near, FACTOR_REL};
use crate::judge::diagnose::parting::{Numbers, Parting, Side};
use crate::judge::diagnose::{Evidence, Loss, Stage};

/// Accumulation's gradients as one factor of the big batch's.
fn factor(ev: &Evidence) -> Option<(usize, f64)> {
    let (s, (x, y)) = (ev.first?, ev.grads()?);
    Some((s, fitted_ratio(y, x, ev.cx.eps)?))
}

/// The short window at an epoch's end divided as if it held K micro-batches.
pub fn short_window(ev: &Evidence) -> Option<Parting> {
    let (s, ratio) = factor(ev)?;
    ev.cx.first_short.filter(|w| w.step == s && (ratio - w.fraction).abs() <= 1e-3 * w.fraction)?;
    Some(Parting::new(Some(s), Some(Stage::Scaling), None, Numbers::ShortWindow { ratio }))
}

/// The window at an epoch's end, by the accumulation leg's recorded facts: it held fewer
/// micro-batches than the K it was told, and each of its losses was still scaled by 1/K (the
/// code that divides, not the data, decides: its owner is named). Not where the big batch
/// agrees: the gradient is then what the big batch made of the same samples.
pub fn window_divided(ev: &Evidence) -> Option<Parting> {
    let s = ev.first?;
    let acc = Leg::at(ev.a, Side::Left, s)?;
    let k = ev.a.header.acc_steps? / acc.world;
    let held = acc.batches.len() / acc.world;
    let scales: Vec<f64> = acc.batches.iter().map(|b| b.scaling()).collect::<Option<_>>()?;
    let by_k = scales.iter().all(|&f| near(f, 1.0 / k as f64, FACTOR_REL));
    (held > 0 && held < k && by_k)
        .then(|| Parting::new(Some(s), Some(Stage::Scaling), Some(Side::Left), Numbers::WindowDivided { held, k }))
}

/// One factor per step where the loss is normalised by tokens: a wrong count.
pub fn token_count(ev: &Evidence) -> Option<Parting> {
    let (s, ratio) = factor(ev).filter(|_| ev.cx.loss == Loss::PerToken)?;
    Some(Parting::new(Some(s), Some(Stage::Loss), None, Numbers::TokenCount { ratio }))
}

/// One factor per step: each micro-batch's loss divided by other than K (K/W on a rank).
pub fn loss_scaling(ev: &Evidence) -> Option<Parting> {
    let (s, ratio) = factor(ev)?;
    Some(Parting::new(Some(s), Some(Stage::Scaling), None, Numbers::BigBatchFactor { ratio }))
}

/// No one factor, though DDP and accumulation agree: each micro-batch normalised by its own
/// count (or, in a user's loop, a loss that couples a batch's samples).
pub fn per_micro_batch_mean(ev: &Evidence) -> Option<Parting> {
    let s = ev.first?;
    if factor(ev).is_some() || (ev.cx.loss != Loss::PerToken && ev.cx.ours()) {
        return None;
    }
    Some(Parting::new(Some(s), Some(Stage::Loss), None, Numbers::PerMicroBatchMean))
}
