//! Judgement: per-step, per-parameter differences between two traces held to the
//! tolerance or the derived bounds, verdicts, diagnoses, and the assembled outcome.

mod diagnose;
mod outcome;
mod reason;

pub use diagnose::{big_batch as diagnose_big_batch, diagnose, Context, Diagnosis};
pub use outcome::{BigBatch, Judging, Outcome, Subject, TracePair};
pub use reason::Reason;

use serde::Serialize;
use tch::Tensor;

use crate::evidence::{Params, RankDrift, ScalerRecord, Trace};
use crate::spec::Tolerance;

/// Three-way, as criterion does it: bit-identical, inside the tolerance, or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    Exact,
    WithinTolerance,
    Diverged,
}

impl Verdict {
    pub fn label(self) -> &'static str {
        match self {
            Verdict::Exact => "exact",
            Verdict::WithinTolerance => "within tolerance",
            Verdict::Diverged => "DIVERGED",
        }
    }
}

/// The largest differences between two tensors of the same name.
#[derive(Debug, Clone, Serialize)]
pub struct TensorDiff {
    pub name: String,
    pub max_abs: f64,
    pub max_rel: f64,
    pub max_ulps: u64,
    /// The largest |Δ| as a fraction of what its element was allowed: 1 is the edge.
    pub worst_fraction: f64,
    pub verdict: Verdict,
    /// Set when the tensors cannot be compared element-wise, or hold NaN/Inf.
    pub problem: Option<String>,
}

/// All tensors of one optimizer step's gradients, or of the final weights.
#[derive(Debug, Clone, Serialize)]
pub struct GroupDiff {
    pub tensors: Vec<TensorDiff>,
    pub max_abs: f64,
    pub max_rel: f64,
    pub max_ulps: u64,
    pub worst_fraction: f64,
    pub verdict: Verdict,
    /// Why this step (or the finals) was not compared, when it was not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_judged: Option<NotJudged>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NotJudged {
    /// Both runs' loss scalers found inf/NaN and skipped the step: its gradients were never
    /// applied; the skip itself is compared (`Comparison::scaler`).
    BothSkipped,
    /// float16's range parted the runs here or before (`RangeParted`).
    RangeParted,
}

impl NotJudged {
    pub fn label(self) -> &'static str {
        match self {
            NotJudged::BothSkipped => "skipped by both loss scalers (inf/NaN)",
            NotJudged::RangeParted => "not judged: float16's range parted the runs",
        }
    }
}

impl GroupDiff {
    fn not_judged(why: NotJudged) -> Self {
        GroupDiff {
            tensors: Vec::new(),
            max_abs: 0.0,
            max_rel: 0.0,
            max_ulps: 0,
            worst_fraction: 0.0,
            verdict: Verdict::Exact,
            not_judged: Some(why),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    pub left: String,
    pub right: String,
    pub tolerance: Tolerance,
    /// Whether each element was held to the bound derived from the arithmetic
    /// (`train::Bounds`) instead of `tolerance`.
    pub derived: bool,
    /// The largest |Δ| of any counted element as a fraction of what it was allowed.
    pub worst_fraction: f64,
    pub left_steps: usize,
    pub right_steps: usize,
    pub steps: Vec<GroupDiff>,
    pub finals: GroupDiff,
    /// BatchNorm running statistics and counters at the end; absent for the linear model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub buffers: Option<GroupDiff>,
    /// Whether `buffers` counts toward the verdict (`--strict-buffers`, or two traces of the
    /// same kind of run, where buffers must agree like anything else).
    pub buffers_counted: bool,
    /// The first step at which the runs applied different learning rates, when both
    /// recorded them: not the same training, whatever the gradients say.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lr: Option<LrMismatch>,
    /// A DDP rank that held another model than rank 0 after some step (either trace's):
    /// the ranks were not running one training, whatever rank 0's numbers say.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank_drift: Option<RankDrift>,
    /// The first step at which the runs' loss scalers did something different, when both
    /// recorded them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scaler: Option<ScalerMismatch>,
    /// Steps float16's range parted the runs at, which were not judged (see `RangeParts`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub range_parted: Option<RangeParted>,
    pub verdict: Verdict,
}

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
    fn of(a: &Trace, b: &Trace) -> Option<Self> {
        let parts = a.range_parts.as_ref().or(b.range_parts.as_ref())?;
        let differ =
            |s: &usize| a.scaler.found_inf.get(*s).zip(b.scaler.found_inf.get(*s)).is_some_and(|(x, y)| x != y);
        let steps: Vec<usize> = parts.steps.iter().copied().filter(differ).collect();
        let from = steps.first().copied().filter(|_| parts.carries);
        (!steps.is_empty()).then_some(RangeParted { steps, from })
    }

    fn covers(&self, step: usize) -> bool {
        self.from.is_some_and(|f| step >= f) || self.steps.contains(&step)
    }

    /// A scaler difference this explains: a skip at a parted step, or anything after the
    /// runs parted for good.
    fn excuses(&self, m: &ScalerMismatch) -> bool {
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
    fn first(a: &ScalerRecord, b: &ScalerRecord, excused: impl Fn(&Self) -> bool) -> Option<Self> {
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
        }
    }

    /// Elements are held to the bounds `allowed` gives (from the accumulation run) instead
    /// of the fixed tolerance: the default, unless --max-ulps/--rtol/--atol were given.
    pub fn derived(mut self, on: bool) -> Self {
        self.derived = on;
        self
    }

    /// One step's gradients; an empty side means that run made no such step. `allowed`
    /// (possibly empty) bounds each element's difference when derived.
    pub fn step(&mut self, a: &Params, b: &Params, allowed: &Params) {
        self.step_at(a, b, allowed, &Params::new());
    }

    /// Like [`Comparer::step`], with recorded per-element magnitudes (`Trace::scales`, may be
    /// empty) that differences are also measured at.
    fn step_at(&mut self, a: &Params, b: &Params, allowed: &Params, magnitudes: &Params) {
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
            let magnitudes = self.sampled(magnitudes);
            let scales = Scales::TensorPeakAnd(&magnitudes);
            self.steps.push(compare_group(&a, &b, &self.tol, scales, bounds.as_ref()));
        }
    }

    /// Final weights and buffers; `a` and `b` may hold steps, which are compared first.
    pub fn finish(mut self, a: &Trace, b: &Trace, buffers_counted: bool) -> Comparison {
        for i in 0..a.steps.len().max(b.steps.len()) {
            let none = Params::new();
            let allowed = a.allowed.get(i).unwrap_or(&none);
            let magnitudes = larger(a.scales.get(i).unwrap_or(&none), b.scales.get(i).unwrap_or(&none));
            self.step_at(a.steps.get(i).unwrap_or(&none), b.steps.get(i).unwrap_or(&none), allowed, &magnitudes);
        }
        // Steps both loss scalers skipped were never applied: their inf/NaN gradients prove
        // nothing either way (a skip in one run only is `scaler`'s to report), nor do steps
        // float16's range parted (`RangeParts`), nor, once free-running runs part, any later.
        let range_parted = RangeParted::of(a, b);
        let both_skipped = a.scaler.found_inf.iter().zip(&b.scaler.found_inf).map(|(x, y)| *x && *y);
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
        let scales = self.sampled(&peaks(a, b));
        let bounds = self.bounds(&a.allowed_finals);
        let (af, bf) = (self.sampled(&a.finals), self.sampled(&b.finals));
        // A parted step applied in one run only: even in lockstep, which restarts weights and
        // scaler but not momentum or AdamW's moments, the final weights differ by it.
        let finals = match range_parted.is_some() {
            true => GroupDiff::not_judged(NotJudged::RangeParted),
            false => compare_group(&af, &bf, &self.tol, Scales::Given(&scales), bounds.as_ref()),
        };
        let buffers = (!a.buffers.is_empty() || !b.buffers.is_empty())
            .then(|| compare_group(&self.sampled(&a.buffers), &self.sampled(&b.buffers), &self.tol, Scales::Own, None));
        let counted: Vec<&GroupDiff> =
            self.steps.iter().chain([&finals]).chain(buffers.iter().filter(|_| buffers_counted)).collect();
        let mut verdict = counted.iter().map(|s| s.verdict).max().unwrap_or(Verdict::Exact);
        let worst_fraction = counted.iter().map(|s| s.worst_fraction).fold(0.0, f64::max);
        let derived = self.derived && (self.bounded || !a.allowed_finals.is_empty());
        if self.left_steps != self.right_steps {
            verdict = Verdict::Diverged;
        }
        // Both computed as lr · f(tick) in float64 from whole numbers: equal or not.
        let lr = a.lrs.iter().zip(&b.lrs).enumerate().find(|(_, (x, y))| x != y);
        let lr = lr.map(|(step, (&left, &right))| LrMismatch { step, left, right });
        let mut worst_fraction = worst_fraction;
        let rank_drift = a.rank_drift.clone().or_else(|| b.rank_drift.clone());
        let scaler =
            ScalerMismatch::first(&a.scaler, &b.scaler, |m| range_parted.as_ref().is_some_and(|p| p.excuses(m)));
        if lr.is_some() || rank_drift.is_some() || scaler.is_some() {
            // Learning rates and the ranks' fingerprints are compared exactly: no
            // difference is allowed.
            verdict = Verdict::Diverged;
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
            verdict,
        }
    }

    /// The derived bounds to hold elements to, if this comparer uses them and has some.
    fn bounds(&self, allowed: &Params) -> Option<Params> {
        (self.derived && !allowed.is_empty()).then(|| self.sampled(allowed))
    }

    fn sampled(&self, p: &Params) -> Params {
        match self.sample {
            Some(k) => p.iter().map(|(n, t)| (n.clone(), crate::evidence::sample(t, k))).collect(),
            None => p.iter().map(|(n, t)| (n.clone(), t.shallow_clone())).collect(),
        }
    }
}

/// Two whole traces; buffers count toward the verdict.
pub fn compare(left: &str, a: &Trace, right: &str, b: &Trace, tol: &Tolerance) -> Comparison {
    Comparer::new(left, right, tol, None).finish(a, b, true)
}

/// Element-wise largest of the two traces' recorded peaks (either may be empty).
fn peaks(a: &Trace, b: &Trace) -> Params {
    larger(&a.peaks, &b.peaks)
}

/// Element-wise largest of two sets of magnitudes, by name (either may be empty).
fn larger(a: &Params, b: &Params) -> Params {
    let mut out: Params = a.iter().map(|(n, t)| (n.clone(), t.shallow_clone())).collect();
    for (name, t) in b {
        match out.iter_mut().find(|(n, _)| n == name) {
            Some((_, mine)) if mine.size() == t.size() => *mine = mine.maximum(t),
            Some(_) => {}
            None => out.push((name.clone(), t.shallow_clone())),
        }
    }
    out
}

/// What relative and ulp differences are measured against, besides the two values.
#[derive(Clone, Copy)]
enum Scales<'a> {
    /// The values alone.
    Own,
    /// Each tensor's largest magnitude in either run, or per element the given magnitude
    /// where it is larger (a tensor of the same name and shape).
    TensorPeakAnd(&'a [(String, Tensor)]),
    /// Per element, where a tensor of the same name and shape is given (final weights' peaks).
    Given(&'a [(String, Tensor)]),
}

/// `bounds`: per element, the largest |Δ| allowed (derived from the arithmetic); without
/// them, `tol` decides.
fn compare_group(a: &Params, b: &Params, tol: &Tolerance, scales: Scales, bounds: Option<&Params>) -> GroupDiff {
    let mut tensors = Vec::new();
    for (name, x) in a {
        match b.iter().find(|(n, _)| n == name) {
            Some((_, y)) => {
                // Computed only past the fast path: most lockstep tensors are bit-identical.
                let scale = || match scales {
                    Scales::Own => None,
                    Scales::TensorPeakAnd(given) => {
                        let peak = x.abs().max().maximum(&y.abs().max()).to_kind(x.kind());
                        let given = given.iter().find(|(n, t)| n == name && t.size() == x.size());
                        Some(given.map_or(peak.shallow_clone(), |(_, m)| m.abs().to_kind(x.kind()).maximum(&peak)))
                    }
                    Scales::Given(given) => {
                        given.iter().find(|(n, t)| n == name && t.size() == x.size()).map(|(_, t)| t.shallow_clone())
                    }
                };
                let bound = bounds.map(|bs| {
                    bs.iter()
                        .find(|(n, t)| n == name && t.size() == x.size())
                        .map(|(_, t)| t.shallow_clone())
                        // A tensor the bounds do not cover (unused in the graph) must match.
                        .unwrap_or_else(|| x.zeros_like().to_kind(tch::Kind::Double))
                });
                tensors.push(compare_tensor(name, x, y, tol, scale, bound))
            }
            None => tensors.push(missing(name, "missing on the right")),
        }
    }
    for (name, _) in b.iter().filter(|(n, _)| !a.iter().any(|(m, _)| m == n)) {
        tensors.push(missing(name, "missing on the left"));
    }
    let fold = |f: fn(&TensorDiff) -> f64| tensors.iter().map(f).fold(0.0, f64::max);
    GroupDiff {
        max_abs: fold(|t| t.max_abs),
        max_rel: fold(|t| t.max_rel),
        max_ulps: tensors.iter().map(|t| t.max_ulps).max().unwrap_or(0),
        worst_fraction: fold(|t| t.worst_fraction),
        verdict: tensors.iter().map(|t| t.verdict).max().unwrap_or(Verdict::Exact),
        tensors,
        not_judged: None,
    }
}

fn missing(name: &str, problem: &str) -> TensorDiff {
    TensorDiff {
        name: name.into(),
        max_abs: f64::INFINITY,
        max_rel: f64::INFINITY,
        max_ulps: u64::MAX,
        worst_fraction: f64::INFINITY,
        verdict: Verdict::Diverged,
        problem: Some(problem.into()),
    }
}

/// With `scale`, relative and ulp differences are taken at max(|x|, |y|, scale) per element.
/// Ulps count in the tensors' own precision (float32, float64, bfloat16, float16); integer counters must
/// match exactly, their "ulps" being the difference itself. With `bound`, an element passes
/// when |Δ| is within its own entry, and `tol` is not used.
fn compare_tensor(
    name: &str,
    x: &Tensor,
    y: &Tensor,
    tol: &Tolerance,
    scale: impl FnOnce() -> Option<Tensor>,
    bound: Option<Tensor>,
) -> TensorDiff {
    if x.size() != y.size() {
        return missing(name, &format!("shape {:?} vs {:?}", x.size(), y.size()));
    }
    use crate::spec::Dtype;
    let precision = match (Dtype::of_kind(x.kind()), Dtype::of_kind(y.kind())) {
        (Some(Dtype::Float64), Some(Dtype::Float64)) => Precision::F64,
        (Some(d), Some(e)) if d == e && d.is_narrow() => Precision::Narrow { digits: d.digits(), min_exp: d.min_exp() },
        // Mixed floats are counted in float32's ulps.
        (Some(_), _) | (_, Some(_)) => Precision::F32,
        _ => Precision::Int,
    };
    let mut d = TensorDiff {
        name: name.into(),
        max_abs: 0.0,
        max_rel: 0.0,
        max_ulps: 0,
        worst_fraction: 0.0,
        verdict: Verdict::Exact,
        problem: None,
    };
    // Fast path, in libtorch: bit-identical and finite (NaN never equals itself; Inf must
    // still be reported). Lockstep's steps are often exact, and a resnet18 step has 11M values.
    // NaN propagates through aminmax, so finite extremes mean every value is finite (and
    // it is one pass with no allocation, where isfinite().all() was four times slower).
    let finite = |t: &Tensor| {
        precision == Precision::Int || {
            let (lo, hi) = t.aminmax(None::<i64>, false);
            lo.double_value(&[]).is_finite() && hi.double_value(&[]).is_finite()
        }
    };
    if x.kind() == y.kind() && x.equal(y) && (x.numel() == 0 || finite(x)) {
        return d;
    }
    // Past the fast path everything is read on the CPU: an index made on one device
    // cannot pick from a tensor on another.
    let cpu = |t: &Tensor| t.to_device(tch::Device::Cpu);
    let (x, y) = (&cpu(x), &cpu(y));
    let bound = bound.map(|b| cpu(&b));
    // Only elements that differ, or are not finite, can count: they are picked out inside
    // libtorch first, so a final resnet18 weight set with a few differing values costs a
    // pass or two instead of three float64 copies of 11M values.
    let mut keep = x.reshape(-1).ne_tensor(&y.reshape(-1));
    if !(finite(x) && finite(y)) {
        let bad = |t: &Tensor| t.reshape(-1).isfinite().logical_not();
        keep = keep.logical_or(&bad(x)).logical_or(&bad(y));
    }
    let picked = keep.nonzero().reshape(-1);
    let pick = |t: &Tensor| t.reshape(-1).index_select(0, &picked);
    let values = |t: &Tensor| Vec::<f64>::try_from(&t.to_kind(tch::Kind::Double)).unwrap_or_default();
    let (xs, ys) = (values(&pick(x)), values(&pick(y)));
    // A per-tensor scale is one value; a per-element one is picked like the values.
    let ss = scale().map(|s| {
        let s = cpu(&s);
        values(&if s.numel() == 1 { s.reshape(-1).expand([picked.size()[0]], false) } else { pick(&s) })
    });
    let bs = bound.map(|b| values(&pick(&b)));
    for (k, (&p, &q)) in xs.iter().zip(&ys).enumerate() {
        // A blown-up run proves nothing, even when both blew up alike.
        if !(p.is_finite() && q.is_finite()) {
            let element = picked.int64_value(&[k as i64]);
            d.problem.get_or_insert_with(|| format!("non-finite value at element {element} ({p} vs {q})"));
            d.verdict = Verdict::Diverged;
            continue;
        }
        if p == q {
            continue;
        }
        let abs = (p - q).abs();
        let at = p.abs().max(q.abs()).max(ss.as_ref().and_then(|s| s.get(k)).map_or(0.0, |s| s.abs()));
        let rel = abs / at;
        let ulps = match precision {
            Precision::Int => abs as u64,
            _ if ss.is_none() => precision.ulps_between(p, q),
            _ => (abs / precision.ulp(at)).ceil() as u64,
        };
        // The fraction of the allowance used: an element passes when it is at most 1.
        let fraction = match (&bs, precision) {
            (_, Precision::Int) => f64::INFINITY,
            (Some(bs), _) => abs / bs[k],
            (None, _) => (abs / tol.atol).min(rel / tol.rtol).min(ulps as f64 / f64::from(tol.max_ulps)),
        };
        let close = fraction <= 1.0;
        d.worst_fraction = d.worst_fraction.max(fraction);
        d.max_abs = d.max_abs.max(abs);
        d.max_rel = d.max_rel.max(rel);
        d.max_ulps = d.max_ulps.max(ulps);
        d.verdict = d.verdict.max(if close { Verdict::WithinTolerance } else { Verdict::Diverged });
    }
    d
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Precision {
    F32,
    F64,
    /// bfloat16 (8 significant bits, float32's exponents) or float16 (11 bits, normal down
    /// to 2^-14); their values are exact in float64, where they are counted.
    Narrow {
        digits: i32,
        min_exp: i32,
    },
    Int,
}

impl Precision {
    /// The spacing of values at |x|.
    fn ulp(self, x: f64) -> f64 {
        match self {
            Precision::F32 => ulp(x as f32) as f64,
            Precision::Narrow { digits, min_exp } => 2f64.powi(binade(x).max(min_exp) - (digits - 1)),
            _ => {
                let x = x.abs();
                f64::from_bits(x.to_bits() + 1) - x
            }
        }
    }

    fn ulps_between(self, a: f64, b: f64) -> u64 {
        match self {
            Precision::F32 => ulps_between(a as f32, b as f32),
            Precision::Narrow { digits, min_exp } => {
                // Index of |x| among the format's non-negative values: 2^(digits-1) per
                // binade above the lowest, plus its significand (subnormals continue below).
                let key = |x: f64| {
                    let e = binade(x).max(min_exp);
                    let significand = x.abs() / 2f64.powi(e - (digits - 1));
                    let k = ((e - min_exp) as f64 * 2f64.powi(digits - 1) + significand).round() as i64;
                    if x.is_sign_negative() {
                        -k
                    } else {
                        k
                    }
                };
                (key(a) - key(b)).unsigned_abs()
            }
            _ => {
                let key = |x: f64| {
                    let mag = (x.to_bits() & 0x7fff_ffff_ffff_ffff) as i128;
                    if x.is_sign_negative() {
                        -mag
                    } else {
                        mag
                    }
                };
                (key(a) - key(b)).unsigned_abs().min(u64::MAX as u128) as u64
            }
        }
    }
}

/// floor(log2 |x|) for a normal float64 (very negative for 0).
fn binade(x: f64) -> i32 {
    if x == 0.0 {
        return i32::MIN / 2;
    }
    ((x.abs().to_bits() >> 52) & 0x7ff) as i32 - 1023
}

/// The spacing of float32 values at |x|.
fn ulp(x: f32) -> f32 {
    let x = x.abs();
    f32::from_bits(x.to_bits() + 1) - x
}

/// Distance in representable float32 values; +0 and -0 count as the same.
pub fn ulps_between(a: f32, b: f32) -> u64 {
    fn key(x: f32) -> i64 {
        let bits = x.to_bits();
        let mag = (bits & 0x7fff_ffff) as i64;
        if bits >> 31 == 1 {
            -mag
        } else {
            mag
        }
    }
    (key(a) - key(b)).unsigned_abs()
}

#[cfg(test)]
mod tests {
    /// bfloat16 is float32's top 16 bits, so its ulp distance is theirs, shifted.
    #[test]
    fn bfloat16_ulps_are_its_bit_distance() {
        let bf16 = super::Precision::Narrow { digits: 8, min_exp: -126 };
        let mut bits: u32 = 12345;
        for _ in 0..2000 {
            bits = bits.wrapping_mul(1_103_515_245).wrapping_add(12345);
            let (a, b) = ((bits >> 1) & 0x7f7f_0000, (bits.rotate_left(13) >> 1) & 0x7f7f_0000);
            let (x, y) = (f32::from_bits(a) as f64, f32::from_bits(b) as f64);
            assert_eq!(bf16.ulps_between(x, y), ((a >> 16) as i64 - (b >> 16) as i64).unsigned_abs(), "{x} {y}");
            assert_eq!(bf16.ulps_between(-x, y), ((a >> 16) as i64 + (b >> 16) as i64) as u64, "{x} {y}");
        }
    }

    #[test]
    fn float16_ulps_cross_binades_and_subnormals() {
        let f16 = super::Precision::Narrow { digits: 11, min_exp: -14 };
        assert_eq!(f16.ulps_between(1.0, 1.0 + 2f64.powi(-10)), 1);
        assert_eq!(f16.ulps_between(1.0, 1.0 - 2f64.powi(-11)), 1);
        assert_eq!(f16.ulps_between(0.0, 2f64.powi(-24)), 1); // the smallest subnormal
        assert_eq!(f16.ulps_between(2f64.powi(-14) - 2f64.powi(-24), 2f64.powi(-14)), 1);
        assert_eq!(f16.ulps_between(65504.0, 65504.0 - 32.0), 1); // the largest finite value
        assert_eq!(f16.ulp(1.0), 2f64.powi(-10));
        assert_eq!(f16.ulp(1e-7), 2f64.powi(-24));
    }

    use super::*;

    #[test]
    fn ulps_counts_representable_steps() {
        assert_eq!(ulps_between(1.0, 1.0), 0);
        assert_eq!(ulps_between(1.0, f32::from_bits(1.0f32.to_bits() + 3)), 3);
        assert_eq!(ulps_between(0.0, -0.0), 0);
        assert_eq!(ulps_between(f32::from_bits(1), -f32::from_bits(1)), 2);
    }

    fn trace(grad: &[f32]) -> Trace {
        let t = Tensor::from_slice(grad);
        Trace { steps: vec![vec![("w".into(), t.copy())]], finals: vec![("w".into(), t)], ..Default::default() }
    }

    #[test]
    fn a_2x_scaling_bug_diverges_under_default_tolerance() {
        let c = compare("a", &trace(&[0.5, 1e-3]), "b", &trace(&[1.0, 2e-3]), &Tolerance::default());
        assert_eq!(c.verdict, Verdict::Diverged);
    }

    #[test]
    fn one_ulp_is_within_tolerance_and_identical_is_exact() {
        let x = 0.7f32;
        let y = f32::from_bits(x.to_bits() + 1);
        let tol = Tolerance::default();
        assert_eq!(compare("a", &trace(&[x]), "b", &trace(&[y]), &tol).verdict, Verdict::WithinTolerance);
        assert_eq!(compare("a", &trace(&[x]), "b", &trace(&[x]), &tol).verdict, Verdict::Exact);
    }

    #[test]
    fn final_weights_are_measured_at_their_peak_magnitude() {
        // A weight that fell from 1.0 to ~0.09: 1 ulp of 1.0 is ~16 ulps of 0.09.
        let x = 0.0899f32;
        let y = x + ulp(1.0);
        let with_peak = |t: Trace| Trace { peaks: vec![("w".into(), Tensor::from_slice(&[1.0f32]))], ..t };
        let tol = Tolerance { max_ulps: 2, rtol: 0.0, atol: 0.0 };
        assert_eq!(compare("a", &trace(&[x]), "b", &trace(&[y]), &tol).finals.verdict, Verdict::Diverged);
        let c = compare("a", &with_peak(trace(&[x])), "b", &trace(&[y]), &tol);
        assert_eq!((c.finals.verdict, c.finals.max_ulps), (Verdict::WithinTolerance, 1));
    }

    /// Each element against its own bound; the report says how much of it was used.
    #[test]
    fn derived_bounds_decide_per_element_and_report_the_fraction_used() {
        let bound = |v: &[f64]| vec![("w".to_string(), Tensor::from_slice(v))];
        let mut a = trace(&[1.0, 2.0]);
        a.allowed = vec![bound(&[1e-2, 1e-3])];
        a.allowed_finals = bound(&[1e-2, 1e-2]);
        let b = trace(&[1.005, 2.0]);
        let tol = Tolerance::default();
        let c = Comparer::new("a", "b", &tol, None).derived(true).finish(&a, &b, true);
        assert!(c.derived);
        assert_eq!(c.verdict, Verdict::WithinTolerance);
        approx::assert_relative_eq!(c.worst_fraction, 0.5, max_relative = 1e-4);
        // The same difference in the element allowed only 1e-3 is five times over.
        let b = trace(&[1.0, 2.005]);
        let c = Comparer::new("a", "b", &tol, None).derived(true).finish(&a, &b, true);
        assert_eq!(c.steps[0].verdict, Verdict::Diverged);
        approx::assert_relative_eq!(c.steps[0].worst_fraction, 5.0, max_relative = 1e-3);
        // Without derived bounds the fixed tolerance decides (0.005 is far past 16 ulp).
        let c = Comparer::new("a", "b", &tol, None).finish(&a, &b, true);
        assert!(!c.derived);
        assert!(c.worst_fraction > 100.0, "{}", c.worst_fraction);
    }

    /// A tensor the bounds do not cover must match exactly (its bound is zero).
    #[test]
    fn an_element_without_a_bound_must_be_identical() {
        let mut a = trace(&[1.0]);
        a.allowed = vec![vec![("other".to_string(), Tensor::from_slice(&[1.0f64]))]];
        let y = f32::from_bits(1.0f32.to_bits() + 1);
        let c = Comparer::new("a", "b", &Tolerance::default(), None).derived(true).finish(&a, &trace(&[y]), true);
        assert_eq!(c.steps[0].verdict, Verdict::Diverged);
    }

    /// Where micro-batch gradients cancel, rounding is a few ulps of their magnitudes, many
    /// of the small result: recorded magnitudes (`scale.*`) measure it there.
    #[test]
    fn recorded_magnitudes_measure_cancelled_gradients_at_their_terms() {
        // 1.0 + (-0.999) in another order: off by an ulp of 1.0, ~10^3 ulps of 1e-3.
        let (x, y) = (1e-3f32, 1e-3f32 + ulp(1.0));
        let (a, b) = (trace(&[x, 0.5e-3]), trace(&[y, 0.5e-3]));
        let tol = Tolerance { max_ulps: 16, rtol: 0.0, atol: 0.0 };
        assert_eq!(compare("a", &a, "b", &b, &tol).steps[0].verdict, Verdict::Diverged);
        let with_scales =
            |t: Trace| Trace { scales: vec![vec![("w".into(), Tensor::from_slice(&[2.0f32, 1e-3]))]], ..t };
        let c = compare("a", &with_scales(a), "b", &b, &tol);
        assert_eq!((c.steps[0].verdict, c.steps[0].max_ulps), (Verdict::WithinTolerance, 1));
    }

    #[test]
    fn nan_or_inf_diverges_even_when_both_runs_agree() {
        for bad in [f32::NAN, f32::INFINITY] {
            let c = compare("a", &trace(&[1.0, bad]), "b", &trace(&[1.0, bad]), &Tolerance::default());
            assert_eq!(c.verdict, Verdict::Diverged);
            assert!(c.steps[0].tensors[0].problem.as_deref().unwrap().contains("element 1"));
        }
    }
}
