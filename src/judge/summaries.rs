//! A sampled tensor's whole: its summaries (sum, sum of squares, max |x|, in float64) held to
//! what its elements' allowances add up to, so a difference outside the sampled elements (one
//! corrupted element, a row never synchronised) is caught as the whole tensor's.
//!
//! If every element i differs by at most its allowance a_i, then |Σx − Σy| ≤ Σ a_i,
//! |Σx² − Σy²| ≤ Σ a_i(|x_i| + |y_i|) ≤ 2P·Σ a_i (P: the larger max |x|), and
//! |max|x| − max|y|| ≤ max a_i. Only the sampled elements' allowances are known: Σ a_i is
//! taken as n times their mean, and max a_i as their largest (at least the allowance at P),
//! each doubled for what a sample of N misses. A summary outside its bound proves some
//! element outside its own allowance, as a whole comparison would have found.

use std::collections::BTreeMap;

use super::{Agreement, Problem, TensorDiff};
use crate::evidence::{Sampled, Summaries, Summary};

/// Both traces' summaries of a step (or of the final weights), and the sampled parameters.
#[derive(Clone, Copy)]
pub(super) struct Wholes<'a> {
    pub left: &'a Summaries,
    pub right: &'a Summaries,
    pub params: &'a BTreeMap<String, Sampled>,
}

impl<'a> Wholes<'a> {
    /// One sampled tensor's, where both traces summarise it.
    pub fn of(&self, name: &str) -> Option<Whole<'a>> {
        Some(Whole { left: self.left.get(name)?, right: self.right.get(name)?, numel: self.params.get(name)?.numel() })
    }
}

/// One sampled tensor's summaries in both traces, and its elements.
#[derive(Clone, Copy)]
pub(super) struct Whole<'a> {
    pub left: &'a Summary,
    pub right: &'a Summary,
    pub numel: usize,
}

/// For a sample of N elements, Σ a_i and max a_i are taken at twice their estimate.
const SAMPLE_MARGIN: f64 = 2.0;

impl Whole<'_> {
    /// The larger max |x| of the two whole tensors (what gradients' differences are measured
    /// at, as a whole comparison measures them).
    pub fn peak(&self) -> f64 {
        self.left.max_abs.max(self.right.max_abs)
    }

    /// Holds the summaries to the bounds `allowed` (each sampled element's allowance) and
    /// `at_peak` (the allowance of an element of magnitude P) give, into `d`.
    pub fn judge(&self, d: &mut TensorDiff, allowed: &[f64], at_peak: f64) {
        let (l, r) = (self.left, self.right);
        if l == r {
            return;
        }
        if !(l.is_finite() && r.is_finite()) {
            d.problem.get_or_insert(Problem::NonFinite { element: -1, left: l.sum, right: r.sum });
            d.verdict = Agreement::Diverged;
            return;
        }
        let n = self.numel as f64;
        let p = self.peak();
        let mean = allowed.iter().sum::<f64>() / allowed.len().max(1) as f64;
        let most = allowed.iter().copied().fold(at_peak, f64::max);
        // Each trace's sums are float64 sums in chunks: pairwise within one, in order across.
        let rounding = (n.log2().max(1.0) + n / 65536.0 + 8.0) * f64::EPSILON * n;
        let sum = SAMPLE_MARGIN * n * mean;
        let bounds = [
            ("sum", l.sum, r.sum, sum + 2.0 * rounding * p),
            ("sum of squares", l.sumsq, r.sumsq, 2.0 * p * sum + 2.0 * rounding * p * p),
            ("max |x|", l.max_abs, r.max_abs, SAMPLE_MARGIN * most),
        ];
        for (what, left, right, allowed) in bounds {
            let diff = (left - right).abs();
            let fraction = if diff == 0.0 { 0.0 } else { diff / allowed };
            d.worst_fraction = d.worst_fraction.max(fraction);
            if fraction > 1.0 {
                d.problem.get_or_insert(Problem::Summary { what, left, right, allowed });
                d.verdict = Agreement::Diverged;
            } else if diff > 0.0 {
                d.verdict = d.verdict.max(Agreement::WithinTolerance);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use proptest::prelude::*;

    use super::super::{compare, Agreement, Comparison, Problem};
    use crate::evidence::{Sampled, Sampling, Trace, Values};
    use crate::spec::{Dtype, Tolerance};

    /// xorshift64*: many elements from one seed, without a tensor library.
    fn values(seed: u64, n: usize) -> Vec<f32> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x >> 12;
                x ^= x << 25;
                x ^= x >> 27;
                let u = (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32 / (1u64 << 24) as f32;
                (u - 0.5) * 2.0 * (1.0 + (u * 7.0).sin())
            })
            .collect()
    }

    /// `n` elements sampled at 1024 increasing positions drawn from `seed`.
    fn sampling(seed: u64, n: usize) -> Sampling {
        let mut pos: Vec<usize> = values(seed ^ 0x5eed, 4096).iter().map(|v| ((v.abs() * 1e6) as usize) % n).collect();
        pos.sort_unstable();
        pos.dedup();
        pos.truncate(1024);
        let params = [("w".to_string(), Sampled { positions: Arc::new(pos), shape: vec![n] })].into();
        Sampling { size: 1024, params, ..Sampling::default() }
    }

    /// A one-step trace of gradient (and final weight) `g`, sampled by `s`.
    fn trace(g: &[f32], s: &Sampling) -> Trace {
        let t = Values::f32s(g.to_vec());
        let whole =
            Trace { steps: vec![vec![("w".into(), t.clone())]], finals: vec![("w".into(), t)], ..Trace::default() };
        whole.sampled_like(s).unwrap()
    }

    fn judged(a: &[f32], b: &[f32], s: &Sampling) -> Comparison {
        compare("a", &trace(a, s), "b", &trace(b, s), &Tolerance::for_run(Dtype::Float32, false))
    }

    fn summary_problem(c: &Comparison) -> bool {
        c.steps[0].tensors[0].problem.as_ref().is_some_and(|p| matches!(p, Problem::Summary { .. }))
    }

    /// Moves `x` by `k` float32 ulps.
    fn ulps(x: f32, k: i32) -> f32 {
        let ulp = f32::from_bits(x.abs().to_bits() + 1) - x.abs();
        x + k as f32 * ulp
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// Rounding (a few ulps per element, as a reordered sum makes) is never caught.
        #[test]
        fn rounding_everywhere_passes(seed in 1u64.., n in 20_000usize..120_000, spread in 1i32..5) {
            let s = sampling(seed, n);
            let a = values(seed, n);
            let b: Vec<f32> = a.iter().enumerate().map(|(i, &x)| ulps(x, (i as i32 % (2 * spread + 1)) - spread)).collect();
            let c = judged(&a, &b, &s);
            prop_assert!(c.verdict != Agreement::Diverged, "{:?}", c.steps[0].tensors[0]);
        }

        /// A factor on every element the sample does not hold is caught by the summaries.
        #[test]
        fn a_factor_outside_the_sample_is_caught(seed in 1u64.., n in 20_000usize..120_000, f in 1.001f32..3.0, down: bool) {
            let s = sampling(seed, n);
            let kept = &s.params["w"].positions;
            let a = values(seed, n);
            let f = if down { 1.0 / f } else { f };
            let b: Vec<f32> = a.iter().enumerate().map(|(i, &x)| if kept.binary_search(&i).is_ok() { x } else { x * f }).collect();
            let c = judged(&a, &b, &s);
            prop_assert!(c.verdict == Agreement::Diverged && summary_problem(&c));
        }

        /// One element outside the sample set past the tensor's range (by 1% of its largest
        /// value or more), or to NaN or infinity, is caught by the summaries.
        #[test]
        fn one_corrupted_element_is_caught(seed in 1u64.., n in 20_000usize..120_000, at: prop::sample::Index, by in 1.01f32..100.0, kind in 0..3) {
            let s = sampling(seed, n);
            let kept = &s.params["w"].positions;
            let a = values(seed, n);
            let k = (0..n).map(|j| (at.index(n) + j) % n).find(|k| kept.binary_search(k).is_err()).unwrap();
            let peak = a.iter().fold(0f32, |m, x| m.max(x.abs()));
            let mut b = a.clone();
            b[k] = [peak * by, f32::NAN, f32::INFINITY][kind as usize];
            let c = judged(&a, &b, &s);
            prop_assert!(c.verdict == Agreement::Diverged, "{:?}", c.steps[0].tensors[0]);
        }
    }

    /// An element moved inside the tensor's range is caught once the move exceeds what every
    /// element's allowance adds up to: in 20k elements, about 2·20k·16 ulps of the peak, less
    /// than the element zeroed here (half the peak or more).
    #[test]
    fn a_zeroed_element_is_caught_by_the_sum() {
        let n = 20_000;
        let s = sampling(7, n);
        let kept = &s.params["w"].positions;
        let a = values(7, n);
        let peak = a.iter().fold(0f32, |m, x| m.max(x.abs()));
        let k = (0..n).find(|&k| kept.binary_search(&k).is_err() && a[k].abs() >= peak / 2.0).unwrap();
        let mut b = a.clone();
        b[k] = 0.0;
        let c = judged(&a, &b, &s);
        assert!(matches!(c.steps[0].tensors[0].problem, Some(Problem::Summary { what: "sum", .. })), "{c:?}");
    }
}
