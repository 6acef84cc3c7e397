//! One group of tensors (a step's gradients, the final weights) element by element, held to
//! the tolerance or the derived bounds.

use tch::Tensor;

use super::ulps::Precision;
use super::{Agreement, GroupDiff, Problem, TensorDiff};
use crate::evidence::Params;
use crate::spec::Tolerance;

/// What relative and ulp differences are measured against, besides the two values.
#[derive(Clone, Copy)]
pub(super) enum Scales<'a> {
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
                        let peak = x.abs().max().maximum(&y.abs().max()).to_kind(x.kind());
                        // Per element, or one number for the tensor (the recorder's
                        // magnitudes="tensor").
                        let given = given.iter().find(|(n, t)| n == name && (t.size() == x.size() || t.numel() == 1));
                        Some(given.map_or(peak.shallow_clone(), |(_, m)| {
                            let m = m.abs().to_kind(x.kind());
                            match m.size() == x.size() {
                                true => m.maximum(&peak),
                                false => m.reshape([]).maximum(&peak),
                            }
                        }))
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
        return missing(name, Problem::Shape { left: x.size(), right: y.size() });
    }
    use crate::spec::{Dtype, TchKind};
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
        verdict: Agreement::Exact,
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
            d.problem.get_or_insert(Problem::NonFinite { element, left: p, right: q });
            d.verdict = Agreement::Diverged;
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
        d.verdict = d.verdict.max(if close { Agreement::WithinTolerance } else { Agreement::Diverged });
    }
    d
}
