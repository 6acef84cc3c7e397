//! The learning-rate schedule: both runs record the rate each step applied.

use super::{Diagnosis, Evidence};
use crate::judge::{LrMismatch, Reason};

/// The runs applied different learning rates at some step: their schedules ticked a
/// different number of times, or one schedule's length was computed otherwise (per rank).
pub fn lr_schedule(ev: &Evidence) -> Option<Diagnosis> {
    let l = ev.c.lr?;
    if let Some(d) = paced(ev, l.step) {
        return Diagnosis::new(Reason::LrSchedule, d);
    }
    Diagnosis::new(
        Reason::LrSchedule,
        format!(
            "{} applied lr {} at step {} where {} applied {}: their schedules ticked a different number of \
             times by then; tick once per optimizer step in both (scheduler.step() after optimizer.step()), \
             not once per micro-batch (K times faster) nor once per process (a scheduler prepared by \
             Accelerate steps W times per step under DDP)",
            ev.left(),
            LrMismatch::shown(l.left),
            l.step,
            ev.right(),
            LrMismatch::shown(l.right)
        ),
    )
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

/// A schedule W times (or K times) as far along in one run, in words. The one process ahead
/// by W ticks per micro-batch (K a step against K/W on each rank); the DDP run ahead by W
/// counted its length from one rank's share of the data, or ticks once per process.
fn paced(ev: &Evidence, t: usize) -> Option<String> {
    let r = pace(&ev.a.facts.lrs, &ev.b.facts.lrs, t)?;
    let w = ev.a.header.world_size.max(ev.b.header.world_size).unwrap_or(1) as f64;
    let k = ev.a.header.acc_steps.or(ev.b.header.acc_steps).map(|k| k as f64);
    let near = |x: f64, y: f64| (x / y - 1.0).abs() < 0.05;
    let ddp_ahead = r >= 1.0; // `b` is the DDP run
    let (fast, slow, by) = if ddp_ahead { (ev.right(), ev.left(), r) } else { (ev.left(), ev.right(), 1.0 / r) };
    let ahead = format!(
        "{fast}'s learning-rate schedule is {by:.0}x as far along as {slow}'s at step {t}, from the same start"
    );
    if w > 1.0 && near(by, w) && ddp_ahead {
        return Some(format!(
            "{ahead}: its length was counted from one rank's share of the data (a rank's loader holds 1/W of the \
             samples, so len(loader) // K gives W times fewer steps), or its scheduler ticks once per process; \
             count the schedule's steps from the whole data set and tick once per optimizer step"
        ));
    }
    let per_micro_batch = (w > 1.0 && near(by, w) && !ddp_ahead) || k.is_some_and(|k| k > 1.0 && near(by, k));
    per_micro_batch.then(|| {
        format!(
            "{ahead}: it ticks once per micro-batch (K times a step in one process, K/W on each rank), or its length \
             counts micro-batches; tick once per optimizer step (scheduler.step() after optimizer.step())"
        )
    })
}
