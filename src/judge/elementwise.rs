//! One group of tensors (a step's gradients, the final weights) element by element, held to
//! the tolerance or the derived bounds.

use super::ulps::Precision;
use super::{Agreement, GroupDiff, Problem, TensorDiff};
use crate::evidence::{Elem, Params, Values, CHUNK};
use crate::spec::Tolerance;

/// What relative and ulp differences are measured against, besides the two values.
#[derive(Clone, Copy)]
pub(super) enum Scales<'a> {
    /// The values alone.
    Own,
    /// Each tensor's largest magnitude in either run, or per element the given magnitude
    /// where it is larger (a tensor of the same name and shape).
    TensorPeakAnd(&'a [(String, Values)]),
    /// Per element, where a tensor of the same name and shape is given (final weights' peaks).
    Given(&'a [(String, Values)]),
}

/// `bounds`: per element, the largest |Δ| allowed (derived from the arithmetic); without
/// them, `tol` decides.
pub(super) fn compare_group(
    a: &Params,
    b: &Params,
    tol: &Tolerance,
    scales: Scales,
    bounds: Option<&Params>,
) -> GroupDiff {
    let mut tensors = Vec::new();
    for (name, x) in a {
        match b.iter().find(|(n, _)| n == name) {
            Some((_, y)) => {
                // Computed only past the fast path: most lockstep tensors are bit-identical.
                let scale = || match scales {
                    Scales::Own => None,
                    Scales::TensorPeakAnd(given) => {
                        let peak = round_to(x.elem(), x.abs_max().max(y.abs_max()));
                        // Per element, or one number for the tensor (the recorder's
                        // magnitudes="tensor").
                        let given = given.iter().find(|(n, t)| n == name && (t.shape() == x.shape() || t.numel() == 1));
                        Some(match given {
                            None => Scale::One(peak),
                            Some((_, m)) if m.shape() == x.shape() => Scale::AtLeast(m.clone(), peak, Some(x.elem())),
                            Some((_, m)) => Scale::One(round_to(x.elem(), m.get(0).abs()).max(peak)),
                        })
                    }
                    Scales::Given(given) => given
                        .iter()
                        .find(|(n, t)| n == name && t.shape() == x.shape())
                        .map(|(_, t)| Scale::AtLeast(t.clone(), 0.0, None)),
                };
                let bound = bounds.map(|bs| {
                    // A tensor the bounds do not cover (unused in the graph) must match.
                    bs.iter().find(|(n, t)| n == name && t.shape() == x.shape()).map(|(_, t)| t.clone())
                });
                tensors.push(compare_tensor(name, x, y, tol, scale, bound))
            }
            None => tensors.push(missing(name, Problem::Missing { on: "right" })),
        }
    }
    for (name, _) in b.iter().filter(|(n, _)| !a.iter().any(|(m, _)| m == n)) {
        tensors.push(missing(name, Problem::Missing { on: "left" }));
    }
    let fold = |f: fn(&TensorDiff) -> f64| tensors.iter().map(f).fold(0.0, f64::max);
    GroupDiff {
        max_abs: fold(|t| t.max_abs),
        max_rel: fold(|t| t.max_rel),
        max_ulps: tensors.iter().map(|t| t.max_ulps).max().unwrap_or(0),
        worst_fraction: fold(|t| t.worst_fraction),
        verdict: tensors.iter().map(|t| t.verdict).max().unwrap_or(Agreement::Exact),
        tensors,
        not_judged: None,
    }
}

pub(super) fn missing(name: &str, problem: Problem) -> TensorDiff {
    TensorDiff {
        name: name.into(),
        max_abs: f64::INFINITY,
        max_rel: f64::INFINITY,
        max_ulps: u64::MAX,
        worst_fraction: f64::INFINITY,
        verdict: Agreement::Diverged,
        problem: Some(problem),
    }
}

/// What relative and ulp differences are taken at, besides the two values.
enum Scale {
    /// One number for the whole tensor.
    One(f64),
    /// Per element |given| (in the compared tensors' dtype, where given), and at least the number.
    AtLeast(Values, f64, Option<Elem>),
}

impl Scale {
    fn at(&self, k: usize) -> f64 {
        match self {
            Scale::One(s) => *s,
            Scale::AtLeast(t, floor, e) => e.map_or(t.get(k).abs(), |e| round_to(e, t.get(k).abs())).max(*floor),
        }
    }
}

/// `x` as the tensor's own dtype holds it (a peak measured in float64 is one of its values,
/// and a per-tensor magnitude is compared in the tensor's dtype).
fn round_to(e: Elem, x: f64) -> f64 {
    match e {
        Elem::F32 => f64::from(x as f32),
        Elem::Bf16 => f64::from(half::bf16::from_f64(x)),
        Elem::F16 => f64::from(half::f16::from_f64(x)),
        Elem::F64 | Elem::I64 => x,
    }
}

/// Flat indices where `x` and `y` differ or either is not finite, in one pass of
/// float64 chunks (most lockstep tensors are bit-identical: nothing is kept).
fn differing(x: &Values, y: &Values) -> Vec<usize> {
    let (mut a, mut b) = ([0.0; CHUNK], [0.0; CHUNK]);
    let mut out = Vec::new();
    let n = x.numel();
    for start in (0..n).step_by(CHUNK) {
        let len = CHUNK.min(n - start);
        x.read_f64(start, &mut a[..len]);
        y.read_f64(start, &mut b[..len]);
        for (k, (p, q)) in a[..len].iter().zip(&b[..len]).enumerate() {
            // NaN != NaN, so NaN is kept; an equal infinity is kept by the second test.
            if p != q || !p.is_finite() {
                out.push(start + k);
            }
        }
    }
    out
}

/// With `scale`, relative and ulp differences are taken at max(|x|, |y|, scale) per element.
/// Ulps count in the tensors' own precision (float32, float64, bfloat16, float16); integer counters must
/// match exactly, their "ulps" being the difference itself. With `bound`, an element passes
/// when |Δ| is within its own entry (none given: it must match), and `tol` is not used.
fn compare_tensor(
    name: &str,
    x: &Values,
    y: &Values,
    tol: &Tolerance,
    scale: impl FnOnce() -> Option<Scale>,
    bound: Option<Option<Values>>,
) -> TensorDiff {
    if x.shape() != y.shape() {
        return missing(name, Problem::Shape { left: x.size(), right: y.size() });
    }
    use crate::spec::Dtype;
    let precision = match (x.dtype(), y.dtype()) {
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
        verdict: Agreement::Exact,
        problem: None,
    };
    // Fast path: bit-identical and finite values cost one pass and keep nothing.
    let picked = differing(x, y);
    if picked.is_empty() {
        return d;
    }
    let ss = scale();
    for &k in &picked {
        let (p, q) = (x.get(k), y.get(k));
        // A blown-up run proves nothing, even when both blew up alike.
        if !(p.is_finite() && q.is_finite()) {
            d.problem.get_or_insert(Problem::NonFinite { element: k as i64, left: p, right: q });
            d.verdict = Agreement::Diverged;
            continue;
        }
        if p == q {
            continue;
        }
        let abs = (p - q).abs();
        let at = p.abs().max(q.abs()).max(ss.as_ref().map_or(0.0, |s| s.at(k)));
        let rel = abs / at;
        let ulps = match precision {
            Precision::Int => abs as u64,
            _ if ss.is_none() => precision.ulps_between(p, q),
            _ => (abs / precision.ulp(at)).ceil() as u64,
        };
        // The fraction of the allowance used: an element passes when it is at most 1.
        let fraction = match (&bound, precision) {
            (_, Precision::Int) => f64::INFINITY,
            (Some(b), _) => abs / b.as_ref().map_or(0.0, |b| b.get(k)),
            (None, _) => (abs / tol.atol).min(rel / tol.rtol).min(ulps as f64 / f64::from(tol.max_ulps)),
        };
        let close = fraction <= 1.0;
        d.worst_fraction = d.worst_fraction.max(fraction);
        d.max_abs = d.max_abs.max(abs);
        d.max_rel = d.max_rel.max(rel);
        d.max_ulps = d.max_ulps.max(ulps);
        d.verdict = d.verdict.max(if close { Agreement::WithinTolerance } else { Agreement::Diverged });
    }
    d
}
