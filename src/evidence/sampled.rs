//! Sampled traces: a trace's size bounded by N elements per tensor, however large the model.
//!
//! Of every parameter tensor of more than N elements the recorder keeps N element positions
//! (the same in every leg and rank: drawn from a fixed seed, the tensor's name and shape, never
//! from the data), their values at each step (gradients, magnitudes, final weights, peaks), and
//! exact summaries of the whole tensor (sum, sum of squares, max |x|, accumulated in float64).
//! In memory a sampled parameter is a flat tensor of its kept elements, so the elementwise
//! judge, AdamW's carried bound and the diagnosis read it as they read a whole one; the
//! summaries are judged beside it (`judge::summaries`).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::trace::{Params, Trace};
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

    /// That `trace`'s tensors are what this sampling says: each sampled parameter's
    /// gradients, final weight, peaks and per-element magnitudes hold one element per
    /// position, and each sampled gradient and final weight has its summaries.
    pub fn check(&self, trace: &Trace) -> Result<(), String> {
        let kept = |what: String, t: &Values, s: &Sampled, one_ok: bool| {
            let n = s.positions.len();
            match t.numel() == n || (one_ok && t.numel() == 1) {
                true => Ok(()),
                false => Err(format!("{what} holds {} elements; positions keep {n}", t.numel())),
            }
        };
        for (name, s) in &self.params {
            let find = |p: &Params| p.iter().find(|(n, _)| n == name).map(|(_, t)| t.clone());
            let w = find(&trace.finals).ok_or_else(|| format!("{name} is sampled but has no final.{name}"))?;
            kept(format!("final.{name}"), &w, s, false)?;
            if !self.finals.contains_key(name) {
                return Err(format!("final.{name} is sampled but has no final_summary.{name}"));
            }
            if let Some(p) = find(&trace.peaks) {
                kept(format!("peak.{name}"), &p, s, false)?;
            }
            for (step, grads) in trace.steps.iter().enumerate() {
                let Some(g) = find(grads) else { continue };
                kept(format!("grads.{step}.{name}"), &g, s, false)?;
                if !self.steps.get(step).is_some_and(|m| m.contains_key(name)) {
                    return Err(format!("grads.{step}.{name} is sampled but has no summary.{step}.{name}"));
                }
                if let Some(m) = trace.scales.get(step).and_then(find) {
                    kept(format!("scale.{step}.{name}"), &m, s, true)?;
                }
            }
        }
        Ok(())
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

impl Values {
    /// The elements at `positions` of the flattened tensor, in its dtype.
    pub fn gather(&self, positions: &[usize]) -> Values {
        // Through float64, which holds every value of these dtypes exactly.
        Values::from_f64_as(self.elem(), &[positions.len()], positions.iter().map(|&k| self.get(k)).collect())
    }
}

impl Trace {
    /// This whole trace as if recorded with `like`'s sampling: each sampled parameter's
    /// tensors kept at its positions, with their summaries; or why it cannot be (a
    /// parameter of another shape, which `compare`'s line-up names in words).
    pub fn sampled_like(mut self, like: &Sampling) -> Result<Trace, String> {
        let mut sampling = Sampling { size: like.size, params: like.params.clone(), ..Sampling::default() };
        for (name, s) in &like.params {
            let Some((_, w)) = self.finals.iter().find(|(n, _)| n == name) else { continue };
            if w.shape() != s.shape.as_slice() {
                return Err(format!("{name} has shape {:?} here and {:?} in the sampled trace", w.shape(), s.shape));
            }
        }
        let keep = |params: &mut Params, summaries: Option<&mut Summaries>| {
            let mut summaries = summaries;
            for (name, t) in params.iter_mut() {
                let Some(s) = like.params.get(name) else { continue };
                if t.numel() != s.numel() {
                    continue; // one per-tensor magnitude stays one number
                }
                if let Some(out) = summaries.as_deref_mut() {
                    out.insert(name.clone(), Summary::of(t));
                }
                let kept = t.gather(&s.positions);
                t.release();
                *t = kept;
            }
        };
        for step in &mut self.steps {
            let mut summaries = Summaries::new();
            keep(step, Some(&mut summaries));
            sampling.steps.push(summaries);
        }
        self.scales.iter_mut().for_each(|s| keep(s, None));
        keep(&mut self.finals, Some(&mut sampling.finals));
        keep(&mut self.peaks, None);
        self.header.sample = Some(like.size);
        self.sampling = Some(sampling);
        Ok(self)
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

    #[test]
    fn a_whole_trace_is_sampled_at_another_traces_positions() {
        let w = Values::from_f64_as(super::super::Elem::F32, &[2, 3], vec![1.0, -2.0, 3.0, -4.0, 5.0, -6.0]);
        let t = Trace { finals: vec![("w".into(), w.clone())], steps: vec![vec![("w".into(), w)]], ..Trace::default() };
        let like = Sampling {
            size: 2,
            params: [("w".to_string(), Sampled { positions: Arc::new(vec![1, 4]), shape: vec![2, 3] })].into(),
            ..Sampling::default()
        };
        let t = t.sampled_like(&like).unwrap();
        assert_eq!(t.steps[0][0].1.to_f64(), vec![-2.0, 5.0]);
        assert_eq!(t.finals[0].1.to_f64(), vec![-2.0, 5.0]);
        let s = t.sampling.unwrap();
        assert_eq!(s.steps[0]["w"], Summary { sum: -3.0, sumsq: 91.0, max_abs: 6.0 });
        let other = Sampling {
            params: [("w".to_string(), Sampled { positions: Arc::new(vec![0, 4]), shape: vec![2, 3] })].into(),
            ..like.clone()
        };
        assert!(like.mismatch(&other).unwrap().contains("w is sampled at other positions"));
    }

    /// Written and read back: the same positions and summaries; a position past the tensor
    /// or a sampled gradient without its summary is refused naming it.
    #[test]
    fn a_sampled_trace_round_trips_and_bad_ones_are_refused() {
        use super::super::header::TraceHeader;
        let raw: BTreeMap<String, String> = [
            ("format", "ddp-verify-trace/2"),
            ("run", "single"),
            ("world_size", "1"),
            ("dtype", "float32"),
            ("sample", "2"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let w = Values::f32s((0..6).map(|i| i as f32 - 2.5).collect());
        let whole = Trace {
            header: TraceHeader::parse(&raw).unwrap(),
            steps: vec![vec![("w".into(), w.clone())]],
            finals: vec![("w".into(), w)],
            ..Trace::default()
        };
        let like = Sampling {
            size: 2,
            params: [("w".to_string(), Sampled { positions: Arc::new(vec![0, 5]), shape: vec![6] })].into(),
            ..Sampling::default()
        };
        let t = whole.sampled_like(&like).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.safetensors");
        t.save(&path).unwrap();
        let back = Trace::load(&path).unwrap();
        assert_eq!(back.sampling, t.sampling);
        assert_eq!(back.steps[0][0].1.to_f64(), vec![-2.5, 2.5]);
        let mut bad = t.sampling.clone().unwrap();
        bad.params.get_mut("w").unwrap().positions = Arc::new(vec![0, 6]);
        let path = dir.path().join("bad.safetensors");
        Trace {
            sampling: Some(bad),
            steps: t.steps.clone(),
            finals: t.finals.clone(),
            header: t.header.clone(),
            ..Trace::default()
        }
        .save(&path)
        .unwrap();
        let err = Trace::load(&path).unwrap_err().to_string();
        assert!(err.contains("positions.w must increase and lie inside shape.w"), "{err}");
        let mut bare = t.sampling.clone().unwrap();
        bare.steps = vec![Summaries::new()];
        let path = dir.path().join("bare.safetensors");
        Trace {
            sampling: Some(bare),
            steps: t.steps.clone(),
            finals: t.finals.clone(),
            header: t.header.clone(),
            ..Trace::default()
        }
        .save(&path)
        .unwrap();
        let err = Trace::load(&path).unwrap_err().to_string();
        assert!(err.contains("grads.0.w is sampled but has no summary.0.w"), "{err}");
    }
}
