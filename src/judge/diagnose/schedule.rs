//! The learning-rate schedule: both runs record the rate each step applied.

use super::{Diagnosis, Evidence};
use crate::judge::{LrMismatch, Reason};

/// The runs applied different learning rates at some step: their schedules ticked a
/// different number of times.
pub fn lr_schedule(ev: &Evidence) -> Option<Diagnosis> {
    let l = ev.c.lr?;
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
