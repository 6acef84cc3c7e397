//! Two runs compared step by step as their gradients arrive, then their final weights and
//! buffers: one [`Comparison`].

use super::elementwise::{compare_group, Scales};
use super::summaries::Wholes;
use super::{Agreement, Comparison, GroupDiff, LrMismatch, NotJudged, RangeParted, Regrouped, ScalerMismatch};
use crate::evidence::{Params, Trace};
use crate::spec::Tolerance;

/// Compares two runs step by step as their gradients arrive, so no step needs to be kept.
pub struct Comparer {
    left: String,
    right: String,
    tol: Tolerance,
    /// Hold elements to the bounds the accumulation run derived, where it gives them.
    derived: bool,
    /// Golden files may keep only a strided sample of each tensor: compare that sample.
    sample: Option<usize>,
    steps: Vec<GroupDiff>,
    left_steps: usize,
    right_steps: usize,
    /// Some step was held to derived bounds.
    bounded: bool,
    /// Why the final weights are not compared, where no bound holds them.
    finals: Option<NotJudged>,
    /// Hold a step whose samples the two runs grouped into other micro-batches to the
    /// tolerance times its micro-batches (`regroupable`; not an explicit tolerance).
    regroup: bool,
    /// Per step, the micro-batches it was regrouped from (1: not regrouped).
    regrouped: Vec<u32>,
}

impl Comparer {
    pub fn new(left: &str, right: &str, tol: &Tolerance, sample: Option<usize>) -> Self {
        Comparer {
            left: left.into(),
            right: right.into(),
            tol: *tol,
            derived: false,
            sample,
            steps: Vec::new(),
            left_steps: 0,
            right_steps: 0,
            bounded: false,
            finals: None,
            regroup: false,
            regrouped: Vec::new(),
        }
    }

    /// Regrouped steps are held to the tolerance times their micro-batches: each run's
    /// micro-batch gradients are then kernels' sums over other samples, whose rounding no
    /// longer cancels between the runs (docs/bounds.md, "Regrouped samples").
    pub fn regroupable(mut self, on: bool) -> Self {
        self.regroup = on;
        self
    }

    /// Elements are held to the bounds `allowed` gives (from the accumulation run) instead
    /// of the fixed tolerance: the default, unless --max-ulps/--rtol/--atol were given.
    pub fn derived(mut self, on: bool) -> Self {
        self.derived = on;
        self
    }

    /// Final weights are judged unless no bound holds them (reported as not judged, why).
    pub fn finals_not_judged(mut self, why: Option<NotJudged>) -> Self {
        self.finals = why;
        self
    }

    /// One step's gradients; an empty side means that run made no such step. `allowed`
    /// (possibly empty) bounds each element's difference when derived.
    pub fn step(&mut self, a: &Params, b: &Params, allowed: &Params) {
        self.step_at(a, b, allowed, &[], None);
    }

    /// Like [`Comparer::step`], with recorded per-element magnitudes (`Trace::scales`, may be
    /// empty) that differences are also measured at.
    /// `wholes`: sampled traces' summaries of this step's whole gradients.
    fn step_at(&mut self, a: &Params, b: &Params, allowed: &Params, magnitudes: &[&Params], wholes: Option<Wholes>) {
        self.left_steps += usize::from(!a.is_empty());
        self.right_steps += usize::from(!b.is_empty());
        if !a.is_empty() && !b.is_empty() {
            // A gradient is a sum of K micro-batch gradients, which the two runs add in
            // different orders; where they cancel, the rounding left over is a few ulps of
            // the terms, not of the small result. So gradients are measured at their
            // tensor's largest magnitude, as final weights are at their peak, and where the
            // terms' magnitudes were recorded, at those too.
            let (a, b) = (self.sampled(a), self.sampled(b));
            let bounds = self.bounds(allowed);
            self.bounded |= bounds.is_some();
            let magnitudes: Vec<Params> = magnitudes.iter().map(|m| self.sampled(m)).collect();
            let scales = Scales::TensorPeakAnd(&magnitudes);
            let k = self.regrouped.get(self.steps.len()).copied().unwrap_or(1);
            self.steps.push(compare_group(&a, &b, &self.tol.times(k), scales, bounds.as_ref(), wholes));
        }
    }

    /// Final weights and buffers; `a` and `b` may hold steps, which are compared first.
    pub fn finish(mut self, a: &Trace, b: &Trace, buffers_counted: bool) -> Comparison {
        if self.regroup {
            let (sa, sb) = (&a.facts.stages, &b.facts.stages);
            self.regrouped = sa
                .iter()
                .zip(sb)
                .map(|(x, y)| x.regrouped(y).map_or(1, |k| u32::try_from(k).unwrap_or(u32::MAX)))
                .collect();
        }
        for i in 0..a.steps.len().max(b.steps.len()) {
            let none = Params::new();
            let allowed = a.allowances.steps.get(i).unwrap_or(&none);
            let magnitudes = [a.scales.get(i).unwrap_or(&none), b.scales.get(i).unwrap_or(&none)];
            let wholes = sampled(a, b)
                .and_then(|(x, y)| Some(Wholes { left: x.steps.get(i)?, right: y.steps.get(i)?, params: &x.params }));
            let (ga, gb) = (a.steps.get(i).unwrap_or(&none), b.steps.get(i).unwrap_or(&none));
            self.step_at(ga, gb, allowed, &magnitudes, wholes);
        }
        // Steps both loss scalers skipped were never applied: their inf/NaN gradients prove
        // nothing either way (a skip in one run only is `scaler`'s to report), nor do steps
        // float16's range parted (`RangePrediction`), nor, once free-running runs part, any later.
        let range_parted = RangeParted::of(a, b);
        let both_skipped = a.facts.scaler.found_inf.iter().zip(&b.facts.scaler.found_inf).map(|(x, y)| *x && *y);
        let both_skipped: Vec<bool> = both_skipped.chain(std::iter::repeat(false)).take(self.steps.len()).collect();
        for (i, (g, skipped)) in self.steps.iter_mut().zip(both_skipped).enumerate() {
            if range_parted.as_ref().is_some_and(|p| p.covers(i)) {
                *g = GroupDiff::not_judged(NotJudged::RangeParted);
            } else if skipped {
                *g = GroupDiff::not_judged(NotJudged::BothSkipped);
            }
        }
        // Final weights are measured at each weight's largest magnitude during training:
        // a weight that shrank from 1.0 to 0.09 was rounded at 1.0's scale on the way.
        let scales = [self.sampled(&a.peaks), self.sampled(&b.peaks)];
        let bounds = self.bounds(&a.allowances.finals);
        let (af, bf) = (self.sampled(&a.finals), self.sampled(&b.finals));
        // A parted step applied in one run only: even in lockstep, which restarts weights and
        // scaler but not momentum or AdamW's moments, the final weights differ by it.
        // A carried bound is per element: what it adds up to over the elements not sampled is
        // not known, so under it sampled final weights are judged at their samples alone.
        let wholes = sampled(a, b).filter(|_| bounds.is_none()).map(|(x, y)| Wholes {
            left: &x.finals,
            right: &y.finals,
            params: &x.params,
        });
        let finals = match (range_parted.is_some(), self.finals) {
            (true, _) => GroupDiff::not_judged(NotJudged::RangeParted),
            (false, Some(why)) => GroupDiff::not_judged(why),
            // Weights trained through regrouped steps carry those steps' rounding.
            (false, None) => {
                let k = self.regrouped.iter().copied().max().unwrap_or(1);
                compare_group(&af, &bf, &self.tol.times(k), Scales::Given(&scales), bounds.as_ref(), wholes)
            }
        };
        let buffers = (!a.buffers.is_empty() || !b.buffers.is_empty()).then(|| {
            compare_group(&self.sampled(&a.buffers), &self.sampled(&b.buffers), &self.tol, Scales::Own, None, None)
        });
        let counted: Vec<&GroupDiff> =
            self.steps.iter().chain([&finals]).chain(buffers.iter().filter(|_| buffers_counted)).collect();
        let mut verdict = counted.iter().map(|s| s.verdict).max().unwrap_or(Agreement::Exact);
        let worst_fraction = counted.iter().map(|s| s.worst_fraction).fold(0.0, f64::max);
        let derived = self.derived && (self.bounded || !a.allowances.finals.is_empty());
        if self.left_steps != self.right_steps {
            verdict = Agreement::Diverged;
        }
        // Both computed as lr · f(tick) in float64 from whole numbers: equal or not.
        let lr = a.facts.lrs.iter().zip(&b.facts.lrs).enumerate().find(|(_, (x, y))| x != y);
        let lr = lr.map(|(step, (&left, &right))| LrMismatch { step, left, right });
        let mut worst_fraction = worst_fraction;
        let rank_drift = a.facts.rank_drift.clone().or_else(|| b.facts.rank_drift.clone());
        let scaler = ScalerMismatch::first(&a.facts.scaler, &b.facts.scaler, |m| {
            range_parted.as_ref().is_some_and(|p| p.excuses(m))
        });
        if lr.is_some() || rank_drift.is_some() || scaler.is_some() {
            // Learning rates and the ranks' fingerprints are compared exactly: no
            // difference is allowed.
            verdict = Agreement::Diverged;
            worst_fraction = f64::INFINITY;
        }
        Comparison {
            left: self.left,
            right: self.right,
            tolerance: self.tol,
            derived,
            worst_fraction,
            left_steps: self.left_steps,
            right_steps: self.right_steps,
            steps: self.steps,
            finals,
            buffers,
            buffers_counted,
            lr,
            rank_drift,
            scaler,
            range_parted,
            hidden_factor: None,
            fact: None,
            by_fact: false,
            regrouped: Regrouped::of(&self.regrouped),
            verdict,
        }
    }

    /// The derived bounds to hold elements to, if this comparer uses them and has some.
    fn bounds(&self, allowed: &Params) -> Option<Params> {
        (self.derived && !allowed.is_empty()).then(|| self.sampled(allowed))
    }

    fn sampled(&self, p: &Params) -> Params {
        match self.sample {
            Some(k) => p.iter().map(|(n, t)| (n.clone(), t.sample(k))).collect(),
            None => p.iter().map(|(n, t)| (n.clone(), t.clone())).collect(),
        }
    }
}

/// Both traces' sampling, where both are sampled traces (`compare` samples a whole one at
/// the other's positions first).
fn sampled<'t>(a: &'t Trace, b: &'t Trace) -> Option<(&'t crate::evidence::Sampling, &'t crate::evidence::Sampling)> {
    Some((a.sampling.as_ref()?, b.sampling.as_ref()?))
}

/// Two whole traces; buffers count toward the verdict.
pub fn compare(left: &str, a: &Trace, right: &str, b: &Trace, tol: &Tolerance) -> Comparison {
    Comparer::new(left, right, tol, None).finish(a, b, true)
}
