//! A trace and its sampling: that a sampled trace's tensors are what its sampling says, and a
//! whole trace sampled at another's positions (so a sampled leg compares with a whole one).

use super::sampled::{Sampled, Sampling, Summaries, Summary};
use super::trace::{Params, Trace};
use super::values::Values;

impl Sampling {
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
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use super::*;

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
        // The same trace with `spoil` done to its sampling: refused, saying `says`.
        let refused = |name: &str, spoil: &dyn Fn(&mut Sampling), says: &str| {
            let mut sampling = t.sampling.clone().unwrap();
            spoil(&mut sampling);
            let path = dir.path().join(name);
            let (steps, finals, header) = (t.steps.clone(), t.finals.clone(), t.header.clone());
            Trace { sampling: Some(sampling), steps, finals, header, ..Trace::default() }.save(&path).unwrap();
            let err = Trace::load(&path).unwrap_err().to_string();
            assert!(err.contains(says), "{err}");
        };
        refused(
            "bad.safetensors",
            &|s| s.params.get_mut("w").unwrap().positions = Arc::new(vec![0, 6]),
            "positions.w must increase and lie inside shape.w",
        );
        refused(
            "bare.safetensors",
            &|s| s.steps = vec![Summaries::new()],
            "grads.0.w is sampled but has no summary.0.w",
        );
    }
}
