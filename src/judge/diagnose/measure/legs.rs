//! Numbers each stage is judged by, measured from one leg's recorded facts at one step: the
//! micro-batches matched across legs by their inputs' fingerprint, what scaled each loss,
//! and what the reduction divided the ranks' local gradients by.

use std::collections::BTreeMap;

use super::{median, near, FACTOR_REL};
use crate::evidence::{Batch, Engine, Framework, StageStep, Trace};
use crate::judge::diagnose::owner::Owner;
use crate::judge::diagnose::parting::{Scaled, Side};

/// One leg at one step.
pub struct Leg<'a> {
    pub trace: &'a Trace,
    pub side: Side,
    pub batches: &'a [Batch],
    pub step: &'a StageStep,
    /// Processes in the leg.
    pub world: usize,
}

impl<'a> Leg<'a> {
    pub fn at(trace: &'a Trace, side: Side, s: usize) -> Option<Leg<'a>> {
        let st = trace.facts.stages.get(s)?;
        (!st.batches.is_empty()).then(|| Leg {
            trace,
            side,
            batches: &st.batches,
            step: st,
            world: trace.header.world_size.unwrap_or(1).max(1),
        })
    }

    /// Micro-batches per rank.
    pub fn per_rank(&self) -> f64 {
        self.batches.len() as f64 / self.world as f64
    }

    /// The inputs' fingerprints, sorted, where every micro-batch has one.
    pub fn fingerprints(&self) -> Option<Vec<u64>> {
        let mut v: Option<Vec<u64>> = self.batches.iter().map(|b| b.fingerprint).collect();
        if let Some(v) = v.as_mut() {
            v.sort_unstable();
        }
        v
    }

    /// 1 in how many of its samples (by hash value) the coarsest micro-batch kept; None
    /// where a micro-batch's samples were not hashed.
    pub fn every(&self) -> Option<u64> {
        self.batches.iter().map(|b| b.rows.map(|r| r.every)).collect::<Option<Vec<_>>>()?.into_iter().max()
    }

    /// A micro-batch's samples kept 1 in `every` (a multiple of each micro-batch's own).
    pub fn samples_of(&self, b: &Batch, every: u64) -> Option<Vec<u64>> {
        Some(b.samples(self.step)?.iter().copied().filter(|h| h % every == 0).collect())
    }

    /// The step's samples, sorted (a multiset), kept 1 in `every`; None where a micro-batch's
    /// were not hashed.
    pub fn samples(&self, every: u64) -> Option<Vec<u64>> {
        let mut v = Vec::new();
        for b in self.batches {
            v.extend(self.samples_of(b, every)?);
        }
        v.sort_unstable();
        Some(v)
    }

    /// Whether any step holds local gradient sums.
    pub fn has_local(&self) -> bool {
        self.trace.facts.stages.iter().any(|s| !s.local.is_empty())
    }

    /// Each rank's one scaling of its micro-batches' losses, by rank in order of first
    /// appearance; None where a rank scaled its own micro-batches apart, or one is unknown.
    pub fn scaling_per_rank(&self) -> Option<Vec<(usize, f64)>> {
        let mut by: Vec<(usize, f64)> = Vec::new();
        for x in self.batches {
            let f = x.scaling()?;
            match by.iter().find(|(r, _)| *r == x.rank) {
                Some((_, g)) if !near(f, *g, FACTOR_REL) => return None,
                Some(_) => {}
                None => by.push((x.rank, f)),
            }
        }
        Some(by)
    }

    /// The typical factor that scaled a loss before backward.
    pub fn scaling(&self) -> Option<f64> {
        median(self.batches.iter().filter_map(Batch::scaling).collect())
    }

    /// The typical factor between the root and the loss with every constant factor peeled
    /// off (a forward that scales its own loss, by a normaliser or by W, included).
    pub fn root_scale(&self) -> Option<f64> {
        median(self.batches.iter().filter_map(|b| Some(b.root? / b.peeled?)).collect()).or_else(|| self.scaling())
    }

    /// The typical factor applied before a framework's backward API (handed / loss) and by
    /// it (root / handed), where a framework took the loss.
    pub fn split(&self) -> Option<(f64, f64)> {
        let pre = median(self.batches.iter().filter_map(|b| Some(b.handed? / b.loss()?)).collect())?;
        let api = median(self.batches.iter().filter_map(|b| Some(b.root? / b.handed?)).collect())?;
        Some((pre, api))
    }

    /// What the reduction divided the ranks' summed local gradients by: fitted
    /// over the parameters (each local sum against the applied gradient's sum, undoing a
    /// clip and a loss scale the recorder saw); None where not recorded or no one factor fits.
    pub fn divide(&self) -> Option<f64> {
        // The first step with local sums (a recording that found its model at the first step
        // has none there): an engine reduces alike every step, and the first step's gradients
        // hold no earlier step's (a gradient never zeroed would fit no one divide later).
        (0..self.trace.facts.stages.len()).find_map(|s| self.divide_at(s))
    }

    /// What the reduction divided by at step `s` alone (`divide`).
    pub fn divide_at(&self, s: usize) -> Option<f64> {
        let t = self.trace;
        let local = &t.facts.stages.get(s)?.local;
        if local.is_empty() {
            return None;
        }
        let applied = unclipped_sums(t, s);
        let pairs: Vec<(f64, f64)> = local.iter().filter_map(|(n, &l)| Some((l, *applied.get(n)?))).collect();
        fit(&pairs)
    }

    /// Each parameter's local gradient sum at step `s`: as recorded, or in one process whose
    /// engine does not accumulate for it, the applied gradient's with a recorded clip and
    /// loss scale undone (nothing else stands between backward and the step there, so the
    /// recorder spares the hooks: `Engine.local_is_applied` in the recorder).
    pub fn local_at(&self, s: usize) -> Option<BTreeMap<String, f64>> {
        let t = self.trace;
        let local = &t.facts.stages.get(s)?.local;
        if !local.is_empty() {
            return Some(local.clone());
        }
        let derived = self.world == 1 && !engine_accumulates(t);
        derived.then(|| unclipped_sums(t, s)).filter(|m| !m.is_empty())
    }
}

/// Who scaled a leg's losses wrong, and how, as its facts split it: `sc` its scaling,
/// `dev` that over what its micro-batches need (below 1: divided too much), `normalised`:
/// its losses follow a normaliser over the window (num_items_in_batch).
pub fn how_scaled(l: &Leg, sc: f64, dev: f64, normalised: bool) -> Scaled {
    let t = l.trace;
    let k = l.per_rank();
    let too_much = dev < 1.0;
    let one = |v: f64| near(v, 1.0, FACTOR_REL);
    match (l.split(), t.header.loss_api) {
        // A loss normalised over the window (num_items_in_batch) handed to an API that
        // divides by its accumulation steps again.
        (Some((_, by_api)), Some(api)) if normalised && too_much && !one(by_api) => {
            Scaled::NormalisedTwice { by_api, api }
        }
        (Some((pre, by_api)), Some(api)) if !one(pre) && !one(by_api) && too_much => Scaled::Twice { pre, by_api, api },
        (Some((pre, by_api)), Some(api)) if one(pre) && !one(by_api) => match t.header.framework_accumulation {
            Some(n) if near(by_api, 1.0 / n as f64, FACTOR_REL) => {
                let api = Owner::of_framework(t, api, "its backward's division of the loss");
                Scaled::ToldAll { n, k, api }
            }
            _ => Scaled::ByApi { by_api, k, api },
        },
        _ => Scaled::Own { sc, k, dev, handed: t.header.loss_handed_by.unwrap_or(Framework::Plain) },
    }
}

/// An engine that accumulates and reduces the gradients itself, out of the script's reach
/// (DeepSpeed's ZeRO: its engine.backward and step).
pub fn engine_accumulates(t: &Trace) -> bool {
    matches!(t.header.engine, Some(e) if e != Engine::Ddp && e != Engine::Fsdp2)
        || t.header.loss_api == Some(Framework::DeepSpeed)
}

/// An engine that accumulates itself, handed each loss and running backward on it
/// unscaled: it divides inside backward (DeepSpeed's hooks on the forward's outputs since
/// 0.18.3), out of the roots' sight, so the roots do not show what reached the gradient.
pub fn scales_inside(t: &Trace) -> bool {
    let mut handed =
        t.facts.stages.iter().flat_map(|s| &s.batches).filter_map(|b| Some((b.root?, b.handed?))).peekable();
    engine_accumulates(t) && handed.peek().is_some() && handed.all(|(r, h)| near(r, h, FACTOR_REL))
}

/// The framework whose code ran torch's backward, else the API the loss was handed to.
pub fn ran_backward(t: &Trace) -> Option<Framework> {
    t.header.backward_by.filter(|f| *f != Framework::Plain).or(t.header.loss_api)
}

/// Each parameter's applied gradient summed, with a clip the recorder saw undone: what the
/// backwards left before it (a loss scale is out of every recorded fact: `evidence::load`).
fn unclipped_sums(t: &Trace, s: usize) -> BTreeMap<String, f64> {
    let clip = t.facts.clip_norms.get(s).copied().flatten().filter(|_| t.facts.clips.get(s).is_some_and(|&c| c > 0));
    let coef = clip.map_or(1.0, |(total, max)| (max / (total + 1e-6)).min(1.0));
    let mut sums = applied_sums(t, s);
    sums.values_mut().for_each(|v| *v /= coef);
    sums
}

/// Each parameter's applied gradient summed: whole tensors, or a sampled one's summary.
fn applied_sums(t: &Trace, s: usize) -> BTreeMap<String, f64> {
    let mut out: BTreeMap<String, f64> = t
        .steps
        .get(s)
        .map(|ps| ps.iter().map(|(n, v)| (n.clone(), v.to_f64().iter().sum())).collect())
        .unwrap_or_default();
    if let Some(summaries) = t.sampling.as_ref().and_then(|sm| sm.steps.get(s)) {
        for (n, sum) in summaries {
            out.insert(n.clone(), sum.sum);
        }
    }
    out
}

/// d with local = d · applied for every pair, fitted by least squares; None where the
/// pairs are all zero or one factor leaves a residual above 1% of the largest local sum.
pub fn fit(pairs: &[(f64, f64)]) -> Option<f64> {
    let (sla, saa) = pairs.iter().fold((0.0, 0.0), |(sla, saa), (l, a)| (sla + l * a, saa + a * a));
    if saa == 0.0 || sla == 0.0 {
        return None;
    }
    let d = sla / saa;
    let peak = pairs.iter().fold(0.0f64, |m, (l, _)| m.max(l.abs()));
    pairs.iter().all(|(l, a)| (l - d * a).abs() <= 1e-2 * peak).then_some(d)
}

/// Pairs of micro-batches, one from each leg, with the same inputs (by fingerprint, in
/// rank and order within each fingerprint).
pub fn matched<'a>(a: &'a [Batch], b: &'a [Batch]) -> Vec<(&'a Batch, &'a Batch)> {
    let mut by: BTreeMap<u64, Vec<&Batch>> = BTreeMap::new();
    for x in a {
        if let Some(f) = x.fingerprint {
            by.entry(f).or_default().push(x);
        }
    }
    let mut out = vec![];
    for y in b {
        if let Some(list) = y.fingerprint.and_then(|f| by.get_mut(&f)) {
            if !list.is_empty() {
                out.push((list.remove(0), y));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::judge::diagnose::measure::near;

    #[test]
    fn one_divide_is_fitted_and_a_mix_is_not() {
        let pairs = [(2.0, 1.0), (-4.0, -2.0), (1e-9, 0.0)];
        assert!(near(fit(&pairs).unwrap(), 2.0, 1e-9));
        assert!(fit(&[(2.0, 1.0), (4.0, 1.0)]).is_none());
        assert!(fit(&[(0.0, 0.0)]).is_none());
    }

    #[test]
    fn micro_batches_are_matched_by_their_inputs() {
        let b = |rank, f| Batch { rank, fingerprint: Some(f), ..Batch::default() };
        let (a, d) = ([b(0, 1), b(0, 2), b(0, 3)], [b(0, 3), b(1, 1), b(1, 9)]);
        let m = matched(&a, &d);
        assert_eq!(m.iter().map(|(x, y)| (x.fingerprint, y.rank)).collect::<Vec<_>>(), [(Some(3), 0), (Some(1), 1)]);
    }
}
