//! One group of tensors (a step's gradients, the final weights) element by element, held to
//! the tolerance or the derived bounds.

use super::summaries::{Whole, Wholes};
use super::ulps::Precision;
use super::{Agreement, GroupDiff, Problem, TensorDiff};
use crate::evidence::{Elem, Params, Values, CHUNK};
use crate::spec::Tolerance;

/// What relative and ulp differences are measured against, besides the two values.
#[derive(Clone, Copy)]
pub(super) enum Scales<'a> {
    /// The values alone.
    Own,
    /// Each tensor's largest magnitude in either run, or per element the given magnitudes
    /// where larger (tensors of the same name and shape, or one number: each run's).
    TensorPeakAnd(&'a [Params]),
    /// Per element, the largest of the given tensors of the same name and shape (final
    /// weights' peaks in each run).
    Given(&'a [Params]),
}

/// `bounds`: per element, the largest |Δ| allowed (derived from the arithmetic); without
/// them, `tol` decides. `wholes`: sampled traces' summaries of the whole tensors, held to
/// what the sampled elements' allowances add up to.
pub(super) fn compare_group(
    a: &Params,
    b: &Params,
    tol: &Tolerance,
    scales: Scales,
    bounds: Option<&Params>,
    wholes: Option<Wholes>,
) -> GroupDiff {
    let mut tensors = Vec::new();
    for (name, x) in a {
        match b.iter().find(|(n, _)| n == name) {
            Some((_, y)) => {
                // Computed only past the fast path: most lockstep tensors are bit-identical.
                // Tensors of this name in each set given, of this shape (or one number).
                let given = |sets: &[Params], one: bool| -> Vec<Values> {
                    let fits = |t: &Values| t.shape() == x.shape() || (one && t.numel() == 1);
                    sets.iter()
                        .filter_map(|p| p.iter().find(|(n, t)| n == name && fits(t)))
                        .map(|(_, t)| t.clone())
                        .collect()
                };
                let scale = |mx: f64, my: f64| match scales {
                    Scales::Own => None,
                    Scales::TensorPeakAnd(sets) => {
                        let mut peak = round_to(x.elem(), mx.max(my));
                        // Per element, or one number for the tensor (the recorder's
                        // magnitudes="tensor").
                        let (each, one): (Vec<Values>, Vec<Values>) =
                            given(sets, true).into_iter().partition(|t| t.shape() == x.shape());
                        for m in one {
                            peak = peak.max(round_to(x.elem(), m.get(0).abs()));
                        }
                        Some(Scale { given: each, floor: peak, round: Some(x.elem()) })
                    }
                    Scales::Given(sets) => {
                        let each = given(sets, false);
                        (!each.is_empty()).then_some(Scale { given: each, floor: 0.0, round: None })
                    }
                };
                let bound = bounds.map(|bs| {
                    // A tensor the bounds do not cover (unused in the graph) must match.
                    bs.iter().find(|(n, t)| n == name && t.shape() == x.shape()).map(|(_, t)| t.clone())
                });
                let whole = wholes.and_then(|w| w.of(name));
                tensors.push(compare_tensor(name, x, y, tol, scale, bound.clone(), whole));
                // Judged: a mapped trace's pages of these tensors go back to the file, so
                // `compare` holds a few tensors at a time, however large the trace.
                let measured = [scales_of(scales, name), bound.flatten().into_iter().collect()].concat();
                [x, y].into_iter().chain(&measured).for_each(Values::release);
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

/// Every tensor of this name the scales hold.
fn scales_of(scales: Scales, name: &str) -> Vec<Values> {
    let sets = match scales {
        Scales::Own => return Vec::new(),
        Scales::TensorPeakAnd(sets) | Scales::Given(sets) => sets,
    };
    sets.iter().filter_map(|p| p.iter().find(|(n, _)| n == name)).map(|(_, t)| t.clone()).collect()
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
/// Per element the largest |given| (rounded to the compared tensors' dtype where `round`
/// says), and at least `floor`.
struct Scale {
    given: Vec<Values>,
    floor: f64,
    round: Option<Elem>,
}

impl Scale {
    fn at(&self, k: usize) -> f64 {
        let each = |t: &Values| self.round.map_or(t.get(k).abs(), |e| round_to(e, t.get(k).abs()));
        self.given.iter().map(each).fold(self.floor, f64::max)
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

/// Runs `f` over both tensors' elements in float64 chunks, `f(state, index of the chunk's
/// first element, x's chunk, y's chunk)`, on every core for large tensors, each thread over
/// one contiguous part with its own state; the states come back in the parts' order.
/// Nothing of the size of a tensor is allocated: a 100M-element gradient costs two 32 KiB
/// buffers a thread.
fn chunks<T: Send>(
    x: &Values,
    y: &Values,
    init: impl Fn() -> T + Sync,
    f: impl Fn(&mut T, usize, &[f64], &[f64]) + Sync,
) -> Vec<T> {
    let n = x.numel();
    let part = |range: std::ops::Range<usize>| {
        let mut state = init();
        let (mut a, mut b) = (vec![0.0; CHUNK], vec![0.0; CHUNK]);
        for start in range.clone().step_by(CHUNK) {
            let len = CHUNK.min(range.end - start);
            x.read_f64(start, &mut a[..len]);
            y.read_f64(start, &mut b[..len]);
            f(&mut state, start, &a[..len], &b[..len]);
        }
        state
    };
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
    if threads == 1 || n < PARALLEL_FROM {
        return vec![part(0..n)];
    }
    let size = n.div_ceil(threads).div_ceil(CHUNK) * CHUNK;
    std::thread::scope(|s| {
        let parts: Vec<_> = (0..n).step_by(size).map(|lo| s.spawn(move || part(lo..(lo + size).min(n)))).collect();
        parts.into_iter().map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e))).collect()
    })
}

/// The largest |Δ| element `k` (values `p`, `q`) passes with: its bound, or what the
/// tolerance allows at max(|p|, |q|, scale): the limit `compare_tensor`'s fraction holds it
/// to (`k` past the end: no scale, no bound).
fn allowance(
    k: usize,
    p: f64,
    q: f64,
    tol: &Tolerance,
    precision: Precision,
    scale: &Option<Scale>,
    bound: &Option<Option<Values>>,
) -> f64 {
    if let Some(b) = bound.as_ref().filter(|_| k != usize::MAX) {
        return b.as_ref().map_or(0.0, |b| b.get(k));
    }
    if precision == Precision::Int {
        return 0.0;
    }
    let at = p.abs().max(q.abs()).max(scale.as_ref().filter(|_| k != usize::MAX).map_or(0.0, |s| s.at(k)));
    tol.allowance(at, precision.ulp(at))
}

/// Tensors this large are judged on every core (smaller ones are not worth the threads).
const PARALLEL_FROM: usize = 1 << 20;

/// Whether any element differs or is not finite (NaN never equals itself; an equal
/// infinity is caught by the second test), and each tensor's largest magnitude.
fn survey(x: &Values, y: &Values) -> (bool, f64, f64) {
    let parts = chunks(
        x,
        y,
        || (false, 0.0f64, 0.0f64),
        |(differs, mx, my), _, a, b| {
            for (p, q) in a.iter().zip(b) {
                *differs |= p != q || !p.is_finite();
                *mx = mx.max(p.abs());
                *my = my.max(q.abs());
            }
        },
    );
    parts.into_iter().fold((false, 0.0, 0.0), |(d, x, y), (e, a, b)| (d || e, x.max(a), y.max(b)))
}

/// With `scale`, relative and ulp differences are taken at max(|x|, |y|, scale) per element.
/// Ulps count in the tensors' own precision (float32, float64, bfloat16, float16); integer counters must
/// match exactly, their "ulps" being the difference itself. With `bound`, an element passes
/// when |Δ| is within its own entry (none given: it must match), and `tol` is not used.
/// With `whole` (a sampled tensor), the tensor's peak is the whole tensor's, and its
/// summaries are judged too.
fn compare_tensor(
    name: &str,
    x: &Values,
    y: &Values,
    tol: &Tolerance,
    scale: impl FnOnce(f64, f64) -> Option<Scale>,
    bound: Option<Option<Values>>,
    whole: Option<Whole>,
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
    let mut d = TensorDiff::exact(name);
    // Fast path: bit-identical and finite values cost one pass and keep nothing.
    let (differs, mx, my) = survey(x, y);
    if !differs && whole.is_none_or(|w| w.left == w.right) {
        return d;
    }
    let (mx, my) = whole.map_or((mx, my), |w| (mx.max(w.left.max_abs), my.max(w.right.max_abs)));
    let ss = scale(mx, my);
    if let Some(w) = whole {
        // Sampled tensors are small (N elements): their allowances are listed.
        let (xs, ys) = (x.to_f64(), y.to_f64());
        let allowed: Vec<f64> =
            (0..xs.len()).map(|k| allowance(k, xs[k], ys[k], tol, precision, &ss, &bound)).collect();
        let at_peak = allowance(usize::MAX, w.peak(), w.peak(), tol, precision, &None, &None);
        w.judge(&mut d, &allowed, at_peak);
    }
    if !differs {
        return d;
    }
    let fresh = || TensorDiff { name: String::new(), ..d.clone() };
    let parts = chunks(x, y, fresh, |d, start, a, b| {
        for (i, (&p, &q)) in a.iter().zip(b).enumerate() {
            if p == q && p.is_finite() {
                continue;
            }
            let k = start + i;
            // A blown-up run proves nothing, even when both blew up alike.
            if !(p.is_finite() && q.is_finite()) {
                d.problem.get_or_insert(Problem::NonFinite { element: k as i64, left: p, right: q });
                d.verdict = Agreement::Diverged;
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
    });
    // In the parts' order: the first non-finite element's problem is the lowest index's.
    for part in parts {
        d.max_abs = d.max_abs.max(part.max_abs);
        d.max_rel = d.max_rel.max(part.max_rel);
        d.max_ulps = d.max_ulps.max(part.max_ulps);
        d.worst_fraction = d.worst_fraction.max(part.worst_fraction);
        d.verdict = d.verdict.max(part.verdict);
        d.problem = d.problem.or(part.problem);
    }
    d
}
