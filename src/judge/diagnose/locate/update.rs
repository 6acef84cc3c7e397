//! The update: learning rates each step applied, the loss scaler's record, clip counts, and
//! what the optimizer made of gradients that agree.

use crate::judge::diagnose::parting::{Numbers, Pace, Parting};
use crate::judge::diagnose::{Evidence, Stage};
use crate::judge::Agreement;

/// The runs applied different learning rates at some step: their schedules ticked a
/// different number of times, or one schedule's length was computed otherwise (per rank).
pub fn lr_schedule(ev: &Evidence) -> Option<Parting> {
    let l = ev.c.lr?;
    let numbers = Numbers::LrSchedule { left: l.left, right: l.right, pace: paced(ev, l.step) };
    Some(Parting::new(Some(l.step), Some(Stage::Update), None, numbers))
}

/// How many times farther along its schedule `b` is than `a` at step `t`: both start at one
/// rate, and a linear schedule's (warm-up's or decay's) distance from it grows with the
/// steps taken over the schedule's length; None where `a` has not moved yet.
fn pace(a: &[f64], b: &[f64], t: usize) -> Option<f64> {
    let (l0, la, lb) = (*a.first()?, *a.get(t)?, *b.get(t)?);
    if b.first() != Some(&l0) || la == l0 {
        return None;
    }
    let r = (l0 - lb) / (l0 - la);
    (r.is_finite() && r > 0.0).then_some(r)
}

/// A schedule W times (or K times) as far along in one run. The one process ahead by W
/// ticks per micro-batch (K a step against K/W on each rank); the DDP run ahead by W
/// counted its length from one rank's share of the data, or ticks once per process.
fn paced(ev: &Evidence, t: usize) -> Option<Pace> {
    let r = pace(&ev.a.facts.lrs, &ev.b.facts.lrs, t)?;
    let w = ev.a.header.world_size.max(ev.b.header.world_size).unwrap_or(1) as f64;
    let k = ev.a.header.acc_steps.or(ev.b.header.acc_steps).map(|k| k as f64);
    let near = |x: f64, y: f64| (x / y - 1.0).abs() < 0.05;
    let ddp_ahead = r >= 1.0; // `b` is the DDP run
    let by = if ddp_ahead { r } else { 1.0 / r };
    if w > 1.0 && near(by, w) && ddp_ahead {
        return Some(Pace { by, ddp_ahead, per_rank_length: true });
    }
    let per_micro_batch = (w > 1.0 && near(by, w) && !ddp_ahead) || k.is_some_and(|k| k > 1.0 && near(by, k));
    per_micro_batch.then_some(Pace { by, ddp_ahead, per_rank_length: false })
}

/// What the runs' loss scalers did differently, from their records.
pub fn loss_scaler(ev: &Evidence) -> Option<Parting> {
    let m = ev.c.scaler?;
    Some(Parting::new(Some(m.step), Some(Stage::Scaling), None, Numbers::LossScaler(m)))
}

/// The runs clipped a different number of times in the first differing step.
pub fn clip_count(ev: &Evidence) -> Option<Parting> {
    let s = ev.first?;
    let (&left, &right) = (ev.a.facts.clips.get(s)?, ev.b.facts.clips.get(s)?);
    (left != right).then(|| Parting::new(Some(s), Some(Stage::Update), None, Numbers::ClipCount { left, right }))
}

/// Every step's gradients agree, yet the runs differ: in what the optimizer made of them,
/// or in the buffers.
pub fn after_the_gradients(ev: &Evidence) -> Option<Parting> {
    if ev.first.is_some() {
        return None;
    }
    if ev.c.finals.verdict != Agreement::Diverged {
        return Some(Parting::new(None, Some(Stage::LocalGradient), None, Numbers::Buffers));
    }
    let carried = ev.cx.ours() || ev.c.derived;
    Some(Parting::new(None, Some(Stage::Update), None, Numbers::OptimizerStep { carried }))
}
