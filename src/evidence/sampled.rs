//! Sampled traces: a trace's size bounded by N elements per tensor, however large the model.
//!
//! Of every parameter tensor of more than N elements the recorder keeps N element positions
//! (the same in every leg and rank: drawn from a fixed seed, the tensor's name and shape, never
//! from the data), their values at each step (gradients, magnitudes, final weights, peaks), and
//! exact summaries of the whole tensor (sum, sum of squares, max |x|, accumulated in float64).
//! In memory a sampled parameter is a flat tensor of its kept elements, so the elementwise
//! judge, AdamW's carried bound and the diagnosis read it as they read a whole one; the
//! summaries are judged beside it (`judge::summaries`); `resample.rs` reads and makes them
//! from a trace.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::values::{Values, CHUNK};

/// One tensor's whole-tensor summaries, in float64.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub sum: f64,
    pub sumsq: f64,
    pub max_abs: f64,
}

impl Summary {
    /// `[sum, sum of squares, max |x|]` as a trace holds it.
    pub fn from_values(v: &Values) -> Summary {
        Summary { sum: v.get(0), sumsq: v.get(1), max_abs: v.get(2) }
    }

    /// The summaries of `v`'s elements, summed in float64 chunk by chunk (as the recorder
    /// sums them); NaN anywhere makes the sums NaN.
    pub fn of(v: &Values) -> Summary {
        let mut s = Summary { sum: 0.0, sumsq: 0.0, max_abs: 0.0 };
        let mut buf = vec![0.0; CHUNK];
        for start in (0..v.numel()).step_by(CHUNK) {
            let len = CHUNK.min(v.numel() - start);
            v.read_f64(start, &mut buf[..len]);
            let (mut sum, mut sq) = (0.0, 0.0);
            for &x in &buf[..len] {
                sum += x;
                sq += x * x;
                // NaN propagates: max would drop it.
                s.max_abs = if x.is_nan() || s.max_abs.is_nan() { f64::NAN } else { s.max_abs.max(x.abs()) };
            }
            s.sum += sum;
            s.sumsq += sq;
        }
        s
    }

    /// `[sum, sum of squares, max |x|]` for a trace file.
    pub fn to_values(self) -> Values {
        Values::f64s(vec![self.sum, self.sumsq, self.max_abs])
    }

    pub fn is_finite(&self) -> bool {
        self.sum.is_finite() && self.sumsq.is_finite() && self.max_abs.is_finite()
    }
}

/// Summaries by parameter name.
pub type Summaries = BTreeMap<String, Summary>;

/// One sampled parameter: where its kept elements sit in it, and its own shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    /// Flat positions, increasing.
    pub positions: Arc<Vec<usize>>,
    pub shape: Vec<usize>,
}

impl Sampled {
    /// Elements in the whole parameter.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// What a sampled trace adds: the positions kept and each tensor's summaries.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sampling {
    /// N: positions kept per tensor larger than that.
    pub size: usize,
    /// The parameters sampled (the others are whole).
    pub params: BTreeMap<String, Sampled>,
    /// Per step, each sampled gradient's summaries.
    pub steps: Vec<Summaries>,
    /// Each sampled final weight's summaries.
    pub finals: Summaries,
}

impl Sampling {
    /// Why two traces' samples cannot be compared element by element, if they cannot.
    pub fn mismatch(&self, other: &Sampling) -> Option<String> {
        let names = |s: &Sampling| s.params.keys().cloned().collect::<Vec<_>>();
        if names(self) != names(other) {
            return Some(format!(
                "different tensors are sampled ({} and {}: sample={} and sample={})",
                self.params.len(),
                other.params.len(),
                self.size,
                other.size
            ));
        }
        let differ = self.params.iter().find(|(n, s)| other.params.get(*n) != Some(s));
        differ
            .map(|(n, _)| format!("{n} is sampled at other positions (sample={} and sample={})", self.size, other.size))
    }

    /// Renames every parameter by `f` (a DDP prefix dropped).
    pub fn rename(&mut self, f: impl Fn(&str) -> String) {
        fn map<T>(m: &mut BTreeMap<String, T>, f: &impl Fn(&str) -> String) {
            *m = std::mem::take(m).into_iter().map(|(n, v)| (f(&n), v)).collect();
        }
        map(&mut self.params, &f);
        self.steps.iter_mut().for_each(|s| map(s, &f));
        map(&mut self.finals, &f);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_are_exact_sums_in_float64() {
        let v = Values::f32s((0..10_000).map(|i| (i as f32 - 5000.0) / 7.0).collect());
        let s = Summary::of(&v);
        let want: f64 = (0..10_000).map(|i| f64::from((i as f32 - 5000.0) / 7.0)).sum();
        assert_eq!(s.sum, want);
        assert_eq!(s.max_abs, f64::from(5000.0f32 / 7.0));
        let nan = Values::f32s(vec![1.0, f32::NAN, 2.0]);
        assert!(!Summary::of(&nan).is_finite() && Summary::of(&nan).max_abs.is_nan());
    }
}
