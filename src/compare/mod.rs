//! Per-step, per-parameter differences between two traces, and verdicts.

mod diagnose;

pub use diagnose::{diagnose, Diagnosis};

use serde::Serialize;
use tch::Tensor;

use crate::config::Tolerance;
use crate::trace::{Params, Trace};

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
    pub verdict: Verdict,
}

#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    pub left: String,
    pub right: String,
    pub tolerance: Tolerance,
    pub left_steps: usize,
    pub right_steps: usize,
    pub steps: Vec<GroupDiff>,
    pub finals: GroupDiff,
    pub verdict: Verdict,
}

pub fn compare(left: &str, a: &Trace, right: &str, b: &Trace, tol: &Tolerance) -> Comparison {
    let steps: Vec<GroupDiff> = a.steps.iter().zip(&b.steps).map(|(x, y)| compare_group(x, y, tol)).collect();
    let finals = compare_group(&a.finals, &b.finals, tol);
    let mut verdict = steps.iter().map(|s| s.verdict).chain([finals.verdict]).max().unwrap_or(Verdict::Exact);
    if a.steps.len() != b.steps.len() {
        verdict = Verdict::Diverged;
    }
    Comparison {
        left: left.into(),
        right: right.into(),
        tolerance: *tol,
        left_steps: a.steps.len(),
        right_steps: b.steps.len(),
        steps,
        finals,
        verdict,
    }
}

fn compare_group(a: &Params, b: &Params, tol: &Tolerance) -> GroupDiff {
    let mut tensors = Vec::new();
    for (name, x) in a {
        match b.iter().find(|(n, _)| n == name) {
            Some((_, y)) => tensors.push(compare_tensor(name, x, y, tol)),
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
        verdict: tensors.iter().map(|t| t.verdict).max().unwrap_or(Verdict::Exact),
        tensors,
    }
}

fn missing(name: &str, problem: &str) -> TensorDiff {
    TensorDiff {
        name: name.into(),
        max_abs: f64::INFINITY,
        max_rel: f64::INFINITY,
        max_ulps: u64::MAX,
        verdict: Verdict::Diverged,
        problem: Some(problem.into()),
    }
}

fn compare_tensor(name: &str, x: &Tensor, y: &Tensor, tol: &Tolerance) -> TensorDiff {
    if x.size() != y.size() {
        return missing(name, &format!("shape {:?} vs {:?}", x.size(), y.size()));
    }
    let xs = Vec::<f32>::try_from(&x.flatten(0, -1)).unwrap_or_default();
    let ys = Vec::<f32>::try_from(&y.flatten(0, -1)).unwrap_or_default();
    let mut d = TensorDiff {
        name: name.into(),
        max_abs: 0.0,
        max_rel: 0.0,
        max_ulps: 0,
        verdict: Verdict::Exact,
        problem: None,
    };
    for (&p, &q) in xs.iter().zip(&ys) {
        if !(p.is_finite() && q.is_finite()) {
            if p.to_bits() != q.to_bits() || p.is_nan() {
                d.problem.get_or_insert_with(|| format!("non-finite values ({p} vs {q})"));
                d.verdict = Verdict::Diverged;
            }
            continue;
        }
        if p.to_bits() == q.to_bits() || p == q {
            continue;
        }
        let abs = (p as f64 - q as f64).abs();
        let rel = abs / (p.abs().max(q.abs()) as f64);
        d.max_abs = d.max_abs.max(abs);
        d.max_rel = d.max_rel.max(rel);
        d.max_ulps = d.max_ulps.max(ulps_between(p, q));
        let close = approx::relative_eq!(p, q, epsilon = tol.atol, max_relative = tol.rtol)
            || approx::ulps_eq!(p, q, epsilon = tol.atol, max_ulps = tol.max_ulps);
        let v = if close { Verdict::WithinTolerance } else { Verdict::Diverged };
        d.verdict = d.verdict.max(v);
    }
    d
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
        Trace { steps: vec![vec![("w".into(), t.copy())]], finals: vec![("w".into(), t)] }
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
    fn nan_diverges() {
        let c = compare("a", &trace(&[f32::NAN]), "b", &trace(&[f32::NAN]), &Tolerance::default());
        assert_eq!(c.verdict, Verdict::Diverged);
    }
}
