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
    let steps: Vec<GroupDiff> = a.steps.iter().zip(&b.steps).map(|(x, y)| compare_group(x, y, tol, &[])).collect();
    // Final weights are measured at each weight's largest magnitude during training:
    // a weight that shrank from 1.0 to 0.09 was rounded at 1.0's scale on the way.
    let finals = compare_group(&a.finals, &b.finals, tol, &peaks(a, b));
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

/// Element-wise largest of the two traces' recorded peaks (either may be empty).
fn peaks(a: &Trace, b: &Trace) -> Params {
    let mut out: Params = a.peaks.iter().map(|(n, t)| (n.clone(), t.shallow_clone())).collect();
    for (name, t) in &b.peaks {
        match out.iter_mut().find(|(n, _)| n == name) {
            Some((_, mine)) if mine.size() == t.size() => *mine = mine.maximum(t),
            Some(_) => {}
            None => out.push((name.clone(), t.shallow_clone())),
        }
    }
    out
}

fn compare_group(a: &Params, b: &Params, tol: &Tolerance, scales: &[(String, Tensor)]) -> GroupDiff {
    let mut tensors = Vec::new();
    for (name, x) in a {
        let scale = scales.iter().find(|(n, t)| n == name && t.size() == x.size()).map(|(_, t)| t);
        match b.iter().find(|(n, _)| n == name) {
            Some((_, y)) => tensors.push(compare_tensor(name, x, y, tol, scale)),
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

/// With `scale`, relative and ulp differences are taken at max(|x|, |y|, scale) per element.
fn compare_tensor(name: &str, x: &Tensor, y: &Tensor, tol: &Tolerance, scale: Option<&Tensor>) -> TensorDiff {
    if x.size() != y.size() {
        return missing(name, &format!("shape {:?} vs {:?}", x.size(), y.size()));
    }
    let values = |t: &Tensor| Vec::<f32>::try_from(&t.flatten(0, -1)).unwrap_or_default();
    let (xs, ys) = (values(x), values(y));
    let ss = scale.map(values);
    let mut d = TensorDiff {
        name: name.into(),
        max_abs: 0.0,
        max_rel: 0.0,
        max_ulps: 0,
        verdict: Verdict::Exact,
        problem: None,
    };
    for (i, (&p, &q)) in xs.iter().zip(&ys).enumerate() {
        // A blown-up run proves nothing, even when both blew up alike.
        if !(p.is_finite() && q.is_finite()) {
            d.problem.get_or_insert_with(|| format!("non-finite value at element {i} ({p} vs {q})"));
            d.verdict = Verdict::Diverged;
            continue;
        }
        if p.to_bits() == q.to_bits() || p == q {
            continue;
        }
        let abs = (p as f64 - q as f64).abs();
        let (rel, ulps, close) = match ss.as_ref().and_then(|s| s.get(i)) {
            None => (
                abs / (p.abs().max(q.abs()) as f64),
                ulps_between(p, q),
                approx::relative_eq!(p, q, epsilon = tol.atol, max_relative = tol.rtol)
                    || approx::ulps_eq!(p, q, epsilon = tol.atol, max_ulps = tol.max_ulps),
            ),
            Some(&s) => {
                let at = p.abs().max(q.abs()).max(s.abs());
                let (rel, ulps) = (abs / at as f64, (abs / ulp(at) as f64).ceil() as u64);
                (rel, ulps, abs <= tol.atol as f64 || rel <= tol.rtol as f64 || ulps <= tol.max_ulps as u64)
            }
        };
        d.max_abs = d.max_abs.max(abs);
        d.max_rel = d.max_rel.max(rel);
        d.max_ulps = d.max_ulps.max(ulps);
        d.verdict = d.verdict.max(if close { Verdict::WithinTolerance } else { Verdict::Diverged });
    }
    d
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
        Trace { steps: vec![vec![("w".into(), t.copy())]], finals: vec![("w".into(), t)], peaks: Vec::new() }
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

    #[test]
    fn nan_or_inf_diverges_even_when_both_runs_agree() {
        for bad in [f32::NAN, f32::INFINITY] {
            let c = compare("a", &trace(&[1.0, bad]), "b", &trace(&[1.0, bad]), &Tolerance::default());
            assert_eq!(c.verdict, Verdict::Diverged);
            assert!(c.steps[0].tensors[0].problem.as_deref().unwrap().contains("element 1"));
        }
    }
}
