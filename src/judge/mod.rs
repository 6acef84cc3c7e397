//! Judgement: per-step, per-parameter differences between two traces held to the
//! tolerance or the derived bounds, verdicts, diagnoses, and the assembled outcome, by one
//! call ([`judge`]) for our own runs and users' traces alike.

mod carried;
mod comparer;
mod control;
mod cost;
mod diagnose;
mod elementwise;
mod events;
mod judgement;
mod outcome;
mod precision;
mod summaries;
mod ulps;
mod watch;

pub use carried::{adamw_finals, finals_judged};
pub use comparer::{compare, Comparer};
pub use control::MARGIN as CONTROL_MARGIN;
pub use cost::{costs, needless_sync, size_words, LegCost};
pub use diagnose::{
    big_batch as diagnose_big_batch, caution, cautioned, diagnose, facts_apart, hidden_by_clipping, Context, Diagnosis,
    FactApart, Loss, Numbers, Origin, Parting, Reason, ShortWindow, Stage,
};
pub use events::{LrMismatch, RangeParted, ScalerEvent, ScalerMismatch};
pub use judgement::{judge, Judging, Terms};
pub use outcome::{BigBatch, Outcome, SampledPair, Subject, TracePair};
pub use precision::{narrow as narrow_dtype, same_precision, PrecisionHeld, Wanted as PrecisionWanted};
pub use ulps::ulps_between;
pub use watch::{watch, Contract, Held, Watched};

use serde::Serialize;

use crate::evidence::RankDrift;
use crate::spec::Tolerance;

/// How two tensors, a step or two runs agree, three-way as criterion says it: bit-identical,
/// inside the tolerance, or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Agreement {
    Exact,
    WithinTolerance,
    Diverged,
}

impl Agreement {
    pub fn label(self) -> &'static str {
        match self {
            Agreement::Exact => "exact",
            Agreement::WithinTolerance => "within tolerance",
            Agreement::Diverged => "DIVERGED",
        }
    }
}

/// What a verification, `compare` or a suite case concludes: one value for the exit code,
/// the word reports and JSON use, and JUnit's failure or error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    Equivalent,
    /// The kernels did not repeat themselves: nothing was judged.
    NoVerdict,
    NotEquivalent,
}

impl Verdict {
    /// As JSON and suites name it.
    pub fn word(self) -> &'static str {
        match self {
            Verdict::Equivalent => "equivalent",
            Verdict::NoVerdict => "no-verdict",
            Verdict::NotEquivalent => "not-equivalent",
        }
    }

    /// As headlines say it.
    pub fn shout(self) -> &'static str {
        match self {
            Verdict::Equivalent => "EQUIVALENT",
            Verdict::NoVerdict => "NO VERDICT",
            Verdict::NotEquivalent => "NOT EQUIVALENT",
        }
    }

    /// Markdown's mark beside it.
    pub fn mark(self) -> &'static str {
        match self {
            Verdict::Equivalent => "✅",
            Verdict::NoVerdict => "⚠️",
            Verdict::NotEquivalent => "❌",
        }
    }

    /// 0 equivalent, 1 not, 4 no verdict.
    pub fn exit(self) -> crate::error::Exit {
        use crate::error::Exit;
        match self {
            Verdict::Equivalent => Exit::Equivalent,
            Verdict::NoVerdict => Exit::NoVerdict,
            Verdict::NotEquivalent => Exit::NotEquivalent,
        }
    }

    /// Many cases' verdict: not equivalent if any is, else no verdict if any has none.
    pub fn of_all(verdicts: impl IntoIterator<Item = Verdict>) -> Verdict {
        verdicts.into_iter().max().unwrap_or(Verdict::Equivalent)
    }
}

/// Why a tensor could not be compared element by element.
#[derive(Debug, Clone, PartialEq)]
pub enum Problem {
    /// In one run's trace only.
    Missing {
        on: &'static str,
    },
    Shape {
        left: Vec<i64>,
        right: Vec<i64>,
    },
    /// NaN or Inf in either run: a blown-up run proves nothing.
    NonFinite {
        element: i64,
        left: f64,
        right: f64,
    },
    /// A sampled tensor's whole-tensor summary differs by more than its elements' allowances
    /// add up to (`summaries`).
    Summary {
        what: &'static str,
        left: f64,
        right: f64,
        allowed: f64,
    },
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Problem::Missing { on } => write!(f, "missing on the {on}"),
            Problem::Shape { left, right } => write!(f, "shape {left:?} vs {right:?}"),
            // A sampled tensor's summaries saw it outside the kept elements.
            Problem::NonFinite { element, left, right } if *element < 0 => {
                write!(f, "non-finite value in the whole tensor (its sums: {left} vs {right})")
            }
            Problem::NonFinite { element, left, right } => {
                write!(f, "non-finite value at element {element} ({left} vs {right})")
            }
            Problem::Summary { what, left, right, allowed } => write!(
                f,
                "the whole tensor's {what} differs: {left:.9e} vs {right:.9e}, by more than its elements' \
                 allowances add up to ({allowed:.3e})"
            ),
        }
    }
}

/// Reports show a problem in words.
impl Serialize for Problem {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
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
    pub verdict: Agreement,
    /// Set when the tensors cannot be compared element-wise, or hold NaN/Inf.
    pub problem: Option<Problem>,
}

impl TensorDiff {
    /// `name` with nothing apart yet: what a comparison starts from.
    pub fn exact(name: impl Into<String>) -> Self {
        TensorDiff {
            name: name.into(),
            max_abs: 0.0,
            max_rel: 0.0,
            max_ulps: 0,
            worst_fraction: 0.0,
            verdict: Agreement::Exact,
            problem: None,
        }
    }
}

/// All tensors of one optimizer step's gradients, or of the final weights.
#[derive(Debug, Clone, Serialize)]
pub struct GroupDiff {
    pub tensors: Vec<TensorDiff>,
    pub max_abs: f64,
    pub max_rel: f64,
    pub max_ulps: u64,
    pub worst_fraction: f64,
    pub verdict: Agreement,
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
    /// Users' traces: an optimizer no bound is carried through, which may amplify rounding
    /// (`judge::finals_judged`); the gradients are judged.
    Optimizer,
    /// A narrow run's big batch: its updates from another grouping's gradients carry a
    /// narrow dtype's rounding through the optimizer, which no control measured (its
    /// gradients are held to the precision control's).
    NarrowBigBatch,
}

impl NotJudged {
    pub fn label(self) -> &'static str {
        match self {
            NotJudged::BothSkipped => "skipped by both loss scalers (inf/NaN)",
            NotJudged::RangeParted => "not judged: float16's range parted the runs",
            NotJudged::Optimizer => "not judged: no bound is carried through the optimizer (the gradients are)",
            NotJudged::NarrowBigBatch => {
                "not judged: a narrow dtype's rounding of one big batch, carried through the optimizer, has no \
                 measured bound (the gradients are)"
            }
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
            verdict: Agreement::Exact,
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
    /// Steps float16's range parted the runs at, which were not judged (see `RangePrediction`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub range_parted: Option<RangeParted>,
    /// A factor between the runs' gradients before clipping (right over left) that clipping
    /// hid at every step and the stage facts show in the losses' scaling or the reduction
    /// (`judgement`): not the same training, though the clipped gradients agree.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hidden_factor: Option<f64>,
    /// A recorded fact apart decided the verdict where the numbers agree (`facts_apart`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub by_fact: bool,
    /// The loss weight apart that decided it, measured against its rounding.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fact: Option<diagnose::FactApart>,
    /// Steps whose samples the runs grouped into other micro-batches, held to the tolerance
    /// times their micro-batches (`Comparer::regroupable`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub regrouped: Option<Regrouped>,
    pub verdict: Agreement,
}

/// Regrouped steps, and the most micro-batches one was cut into (the widest tolerance).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Regrouped {
    pub steps: usize,
    pub micro_batches: u32,
}

impl Regrouped {
    fn of(per_step: &[u32]) -> Option<Regrouped> {
        let steps = per_step.iter().filter(|k| **k > 1).count();
        (steps > 0).then(|| Regrouped { steps, micro_batches: per_step.iter().copied().max().unwrap_or(1) })
    }
}

#[cfg(test)]
mod tests {
    use super::ulps::ulp;
    use super::*;
    use crate::evidence::{Trace, Values};
    use crate::spec::Tolerance;

    fn trace(grad: &[f32]) -> Trace {
        let t = Values::f32s(grad.to_vec());
        Trace { steps: vec![vec![("w".into(), t.clone())]], finals: vec![("w".into(), t)], ..Default::default() }
    }

    #[test]
    fn a_2x_scaling_bug_diverges_under_default_tolerance() {
        let c = compare("a", &trace(&[0.5, 1e-3]), "b", &trace(&[1.0, 2e-3]), &Tolerance::default());
        assert_eq!(c.verdict, Agreement::Diverged);
    }

    #[test]
    fn one_ulp_is_within_tolerance_and_identical_is_exact() {
        let x = 0.7f32;
        let y = f32::from_bits(x.to_bits() + 1);
        let tol = Tolerance::default();
        assert_eq!(compare("a", &trace(&[x]), "b", &trace(&[y]), &tol).verdict, Agreement::WithinTolerance);
        assert_eq!(compare("a", &trace(&[x]), "b", &trace(&[x]), &tol).verdict, Agreement::Exact);
    }

    #[test]
    fn final_weights_are_measured_at_their_peak_magnitude() {
        // A weight that fell from 1.0 to ~0.09: 1 ulp of 1.0 is ~16 ulps of 0.09.
        let x = 0.0899f32;
        let y = x + ulp(1.0);
        let with_peak = |t: Trace| Trace { peaks: vec![("w".into(), Values::f32s(vec![1.0]))], ..t };
        let tol = Tolerance { max_ulps: 2, rtol: 0.0, atol: 0.0 };
        assert_eq!(compare("a", &trace(&[x]), "b", &trace(&[y]), &tol).finals.verdict, Agreement::Diverged);
        let c = compare("a", &with_peak(trace(&[x])), "b", &trace(&[y]), &tol);
        assert_eq!((c.finals.verdict, c.finals.max_ulps), (Agreement::WithinTolerance, 1));
    }

    /// Each element against its own bound; the report says how much of it was used.
    #[test]
    fn derived_bounds_decide_per_element_and_report_the_fraction_used() {
        let bound = |v: &[f64]| vec![("w".to_string(), Values::f64s(v.to_vec()))];
        let mut a = trace(&[1.0, 2.0]);
        a.allowances.steps = vec![bound(&[1e-2, 1e-3])];
        a.allowances.finals = bound(&[1e-2, 1e-2]);
        let b = trace(&[1.005, 2.0]);
        let tol = Tolerance::default();
        let c = Comparer::new("a", "b", &tol, None).derived(true).finish(&a, &b, true);
        assert!(c.derived);
        assert_eq!(c.verdict, Agreement::WithinTolerance);
        approx::assert_relative_eq!(c.worst_fraction, 0.5, max_relative = 1e-4);
        // The same difference in the element allowed only 1e-3 is five times over.
        let b = trace(&[1.0, 2.005]);
        let c = Comparer::new("a", "b", &tol, None).derived(true).finish(&a, &b, true);
        assert_eq!(c.steps[0].verdict, Agreement::Diverged);
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
        a.allowances.steps = vec![vec![("other".to_string(), Values::f64s(vec![1.0]))]];
        let y = f32::from_bits(1.0f32.to_bits() + 1);
        let c = Comparer::new("a", "b", &Tolerance::default(), None).derived(true).finish(&a, &trace(&[y]), true);
        assert_eq!(c.steps[0].verdict, Agreement::Diverged);
    }

    /// Where micro-batch gradients cancel, rounding is a few ulps of their magnitudes, many
    /// of the small result: recorded magnitudes (`scale.*`) measure it there.
    #[test]
    fn recorded_magnitudes_measure_cancelled_gradients_at_their_terms() {
        // 1.0 + (-0.999) in another order: off by an ulp of 1.0, ~10^3 ulps of 1e-3.
        let (x, y) = (1e-3f32, 1e-3f32 + ulp(1.0));
        let (a, b) = (trace(&[x, 0.5e-3]), trace(&[y, 0.5e-3]));
        let tol = Tolerance { max_ulps: 16, rtol: 0.0, atol: 0.0 };
        assert_eq!(compare("a", &a, "b", &b, &tol).steps[0].verdict, Agreement::Diverged);
        let with_scales = |t: Trace| Trace { scales: vec![vec![("w".into(), Values::f32s(vec![2.0, 1e-3]))]], ..t };
        let c = compare("a", &with_scales(a), "b", &b, &tol);
        assert_eq!((c.steps[0].verdict, c.steps[0].max_ulps), (Agreement::WithinTolerance, 1));
    }

    #[test]
    fn nan_or_inf_diverges_even_when_both_runs_agree() {
        for bad in [f32::NAN, f32::INFINITY] {
            let c = compare("a", &trace(&[1.0, bad]), "b", &trace(&[1.0, bad]), &Tolerance::default());
            assert_eq!(c.verdict, Agreement::Diverged);
            assert!(c.steps[0].tensors[0].problem.as_ref().unwrap().to_string().contains("element 1"));
        }
    }
}
