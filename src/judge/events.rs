//! What the runs did besides their numbers, where it differs: float16's range parting them,
//! their loss scalers, their learning rates.

use crate::evidence::{ScalerRecord, Trace};

use serde::Serialize;

/// The steps at which the runs' loss scalers did part as the accumulation run predicted
/// from DDP's arithmetic, and, free-running, the first of them, from which on nothing was
/// judged (the runs applied different steps there). The final weights are never judged then.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RangeParted {
    pub steps: Vec<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from: Option<usize>,
}

impl RangeParted {
    /// Where the predicted steps are ones the two records really disagree on skipping.
    pub(super) fn of(a: &Trace, b: &Trace) -> Option<Self> {
        let parts = a.allowances.range_parts.as_ref().or(b.allowances.range_parts.as_ref())?;
        let differ = |s: &usize| {
            a.facts.scaler.found_inf.get(*s).zip(b.facts.scaler.found_inf.get(*s)).is_some_and(|(x, y)| x != y)
        };
        let steps: Vec<usize> = parts.steps.iter().copied().filter(differ).collect();
        let from = steps.first().copied().filter(|_| parts.carries);
        (!steps.is_empty()).then_some(RangeParted { steps, from })
    }

    pub(super) fn covers(&self, step: usize) -> bool {
        self.from.is_some_and(|f| step >= f) || self.steps.contains(&step)
    }

    /// A scaler difference this explains: a skip at a parted step, or anything after the
    /// runs parted for good.
    pub(super) fn excuses(&self, m: &ScalerMismatch) -> bool {
        self.from.is_some_and(|f| m.step > f) || (m.what == ScalerEvent::Skipped && self.covers(m.step))
    }
}

/// What two loss scalers did differently at one step: the scale the losses were multiplied
/// by, whether inf/NaN was found (the step skipped), how often the gradients were unscaled
/// or the scale updated.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ScalerMismatch {
    pub step: usize,
    pub what: ScalerEvent,
    pub left: f64,
    pub right: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ScalerEvent {
    LossScale,
    Skipped,
    Unscales,
    Updates,
}

impl ScalerMismatch {
    /// What differed, in words: "<left> <did> at step s where <right> <did>".
    pub fn describe(&self, left: &str, right: &str) -> String {
        let s = self.step;
        let n = |x: f64| x as i64;
        match self.what {
            ScalerEvent::LossScale => {
                format!("{left} scaled step {s}'s losses by {} where {right} scaled them by {}", self.left, self.right)
            }
            ScalerEvent::Skipped => {
                let (skipper, stepper) = if self.left != 0.0 { (left, right) } else { (right, left) };
                format!("{skipper} found inf/NaN and skipped step {s} where {stepper} stepped")
            }
            ScalerEvent::Unscales => format!(
                "{left} unscaled its gradients {} times in step {s} where {right} unscaled them {} times",
                n(self.left),
                n(self.right)
            ),
            ScalerEvent::Updates => format!(
                "{left} updated the loss scale {} times in step {s} where {right} updated it {} times",
                n(self.left),
                n(self.right)
            ),
        }
    }

    /// The first difference between two records that `excused` does not explain, series by
    /// series in the order a step runs.
    pub(super) fn first(a: &ScalerRecord, b: &ScalerRecord, excused: impl Fn(&Self) -> bool) -> Option<Self> {
        let f = |v: &[bool]| v.iter().map(|&x| f64::from(u8::from(x))).collect::<Vec<f64>>();
        let i = |v: &[i64]| v.iter().map(|&x| x as f64).collect::<Vec<f64>>();
        let series = [
            (ScalerEvent::Unscales, i(&a.unscales), i(&b.unscales)),
            (ScalerEvent::Updates, i(&a.updates), i(&b.updates)),
            (ScalerEvent::LossScale, a.scales.clone(), b.scales.clone()),
            (ScalerEvent::Skipped, f(&a.found_inf), f(&b.found_inf)),
        ];
        series
            .into_iter()
            .filter_map(|(what, l, r)| {
                let all = l.iter().zip(&r).enumerate().filter(|(_, (x, y))| x != y);
                let mut all = all.map(|(step, (&left, &right))| ScalerMismatch { step, what, left, right });
                all.find(|m| !excused(m))
            })
            .min_by_key(|m| m.step)
    }
}

/// One step's learning rate in each run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LrMismatch {
    pub step: usize,
    pub left: f64,
    pub right: f64,
}

impl LrMismatch {
    /// A learning rate for people: 12 significant digits, so 0.1·0.7 reads 0.07, not
    /// 0.06999999999999999 (the values themselves are compared exactly).
    pub fn shown(v: f64) -> f64 {
        format!("{v:.11e}").parse().unwrap_or(v)
    }
}
