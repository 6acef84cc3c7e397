//! One run judged by each stage's contract, step by step (`ddp-verify watch`): what makes W
//! ranks with K/W micro-batches each equal one process accumulating all K, read from the
//! run's own recorded facts with no reference run (`docs/watch.md` derives each). Both legs
//! of the evidence are the run; the step judged is `ev.first`. A contract that a fact was not
//! recorded for is silent.

use std::collections::BTreeMap;

use crate::evidence::{Batch, NormaliserScope};
use crate::judge::diagnose::measure::factor::is_whole;
use crate::judge::diagnose::measure::legs::{engine_accumulates, how_scaled, scales_inside, Leg};
use crate::judge::diagnose::measure::{median, near, FACTOR_REL};
use crate::judge::diagnose::parting::{Numbers, Parting, Side};
use crate::judge::diagnose::{Evidence, Stage};

/// Of a rank's kept samples, the share another rank must also hold in the same step before
/// the ranks are said to train on the same data: real data sets repeat some rows (duplicates,
/// padding), and no sampler deals one rank most of another's.
const SHARED: f64 = 0.5;

/// How near a clipped gradient's norm is to its max_norm (clip_grad_norm_ scales by
/// max_norm / (total + 1e-6), and the norm is summed in float32).
const CLIPPED_REL: f64 = 1e-3;

/// The run at the step judged.
fn leg<'a>(ev: &Evidence<'a>) -> Option<Leg<'a>> {
    Leg::at(ev.b, Side::Right, ev.first?)
}

/// How near two factors read off this run's losses must be to be one: a loss computed in a
/// narrow dtype (DeepSpeed's bfloat16 engine) divided by 3 rounds the constant and the
/// product to that dtype, so the factor is known to its epsilon, not to float32's.
fn factor_rel(l: &Leg) -> f64 {
    FACTOR_REL.max(2.0 * l.trace.header.loss_dtype.map_or(0.0, |t| t.epsilon()))
}

fn at(s: usize, stage: Stage, numbers: Numbers) -> Option<Parting> {
    Some(Parting::new(Some(s), Some(stage), Some(Side::Right), numbers))
}

/// Samples: the ranks' micro-batches in one step are different samples. Two ranks that
/// share most of their samples read the same data (no DistributedSampler, one seed for
/// every rank); a few shared rows are a data set's duplicates or a sampler's padding.
pub fn shared_samples(ev: &Evidence) -> Option<Parting> {
    let l = leg(ev)?;
    if l.world < 2 {
        return None;
    }
    let every = l.every()?;
    let mut by_rank: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
    for b in l.batches {
        by_rank.entry(b.rank).or_default().extend(l.samples_of(b, every)?);
    }
    for v in by_rank.values_mut() {
        v.sort_unstable();
        v.dedup();
    }
    let ranks: Vec<(&usize, &Vec<u64>)> = by_rank.iter().collect();
    for (i, (r0, x)) in ranks.iter().enumerate() {
        for (r1, y) in &ranks[i + 1..] {
            let shared = x.iter().filter(|h| y.binary_search(h).is_ok()).count();
            let of = x.len().min(y.len());
            if of > 0 && shared as f64 >= SHARED * of as f64 {
                let numbers = Numbers::SharedSamples { ranks: (**r0, **r1), shared, of: x.len(), every };
                return at(ev.first?, Stage::Samples, numbers);
            }
        }
    }
    None
}

/// The stages of the step judged, in a micro-batch's order: zeroing inside the window, the
/// normalisers' weights, each rank's own scaling, the reduction, the scaling of every
/// micro-batch, the clip.
pub fn walk(ev: &Evidence) -> Option<Parting> {
    let l = leg(ev)?;
    let s = ev.first?;
    zeroed(&l, s)
        .or_else(|| normalisers(&l, s))
        .or_else(|| own_counts(&l, s))
        .or_else(|| scaled_per_rank(&l, s))
        .or_else(|| reduction(&l, s))
        .or_else(|| short_window(&l, s))
        .or_else(|| scaling(&l, s))
        .or_else(|| clipped_alone(&l, s))
}

/// Local gradient: zeroed after a backward and before the step, the micro-batches before
/// it never reach the update.
fn zeroed(l: &Leg, s: usize) -> Option<Parting> {
    let times = l.step.zeroed;
    (times > 0).then_some(())?;
    at(s, Stage::LocalGradient, Numbers::ZeroedInWindow { times })
}

/// What each item of a micro-batch weighs in the applied gradient before the reduction's
/// divide: its loss's scaling over the normaliser it was divided by.
fn item_weight(b: &Batch) -> Option<f64> {
    Some(b.scaling()? / b.normaliser?).filter(|w| w.is_finite() && *w > 0.0)
}

/// Loss: micro-batches passed normalisers (num_items_in_batch) must weigh every item of the
/// window alike on every rank, as one process dividing the window's sum by its count does.
/// Ranks that each count their own items weigh them otherwise wherever the counts differ.
fn normalisers(l: &Leg, s: usize) -> Option<Parting> {
    let rel = factor_rel(l);
    let weights: Vec<(usize, f64, f64)> =
        l.batches.iter().filter_map(|b| Some((b.rank, b.normaliser?, item_weight(b)?))).collect();
    let first = weights.first()?;
    if weights.iter().all(|(_, _, w)| near(*w, first.2, rel)) {
        return None;
    }
    let mut by_rank: Vec<(usize, f64, f64)> = Vec::new();
    for &(r, n, w) in &weights {
        match by_rank.iter().find(|(q, _, _)| *q == r) {
            // A rank whose own micro-batches weigh apart divides each by its own count: a
            // per-micro-batch mean, which the big batch judges, not the ranks' contract.
            Some((_, _, v)) if !near(w, *v, rel) => return None,
            Some(_) => {}
            None => by_rank.push((r, n, w)),
        }
    }
    (by_rank.len() > 1).then_some(())?;
    at(s, Stage::Loss, Numbers::NormalisersApart { by_rank })
}

/// Loss: a rank's micro-batches each divided by a count of its own, where one process divides
/// the window's sum by the window's count: each passed another num_items_in_batch, and its
/// loss followed it (the factor peeled off its graph times its normaliser is one number over
/// the window), so its items weigh 1/(k·n) unequally. A loss that ignores what it was passed
/// (a mean of its own, or a sum over a count the script made) is left to the scaling and the
/// big batch: one run cannot tell its count.
fn own_counts(l: &Leg, s: usize) -> Option<Parting> {
    let rel = factor_rel(l);
    let mut ranks: BTreeMap<usize, Vec<(f64, f64)>> = BTreeMap::new();
    for b in l.batches {
        let (n, root, peeled) = (b.normaliser?, b.root?, b.peeled?);
        (n > 0.0 && peeled != 0.0).then_some(())?;
        ranks.entry(b.rank).or_default().push((n, root / peeled));
    }
    ranks.into_iter().find_map(|(rank, v)| {
        let apart = v.iter().any(|(n, _)| !near(*n, v[0].0, 1e-9));
        let follows = v.iter().all(|(n, f)| near(n * f, v[0].0 * v[0].1, rel));
        (v.len() > 1 && apart && follows).then(|| {
            let counts = v.iter().map(|(n, _)| *n).collect();
            Parting::new(
                Some(s),
                Some(Stage::Loss),
                Some(Side::Right),
                Numbers::NormalisedPerMicroBatch { rank, counts },
            )
        })
    })
}

/// Scaling: each rank scaled every one of its micro-batches by a factor of its own, where
/// one process scales all of the window's alike.
fn scaled_per_rank(l: &Leg, s: usize) -> Option<Parting> {
    let rel = factor_rel(l);
    if l.world < 2 || l.batches.iter().any(|b| b.normaliser.is_some()) {
        return None;
    }
    let by = l.scaling_per_rank()?;
    if by.len() < 2 || by.iter().all(|(_, f)| near(*f, by[0].1, rel)) {
        return None;
    }
    // Each rank dividing by a count of its own (1/n_r): one process divides by them all.
    let one = 1.0 / by.iter().map(|(_, f)| 1.0 / f).sum::<f64>();
    at(s, Stage::Scaling, Numbers::ScaledPerRank { scales: by, one })
}

/// Reduction: the applied gradient is the mean of the ranks' local gradients, the divide
/// fitted over the parameters (a clip and a loss scale the recorder saw undone). An engine
/// that accumulates itself and whose applied gradient is no multiple of the backwards' lost
/// micro-batches.
fn reduction(l: &Leg, s: usize) -> Option<Parting> {
    let engine = engine_accumulates(l.trace);
    if l.world < 2 && !engine {
        return None;
    }
    if l.step.local.is_empty() {
        return None;
    }
    let w = l.world as f64;
    match l.divide_at(s) {
        Some(d) => {
            // Local sums of a lower compute dtype's gradients against an fp32 accumulator.
            let rel = FACTOR_REL.max(4.0 * l.trace.header.compute_dtype.map_or(0.0, |t| t.epsilon()));
            (!near(d, w, rel)).then_some(())?;
            let configured = l.trace.header.grad_divide.is_some_and(|f| !near(f, w, 1e-9));
            at(s, Stage::Reduction, Numbers::Reduction { divide: d, world: l.world, configured })
        }
        // Between boundaries marked by hand the engine reduces nothing (it was told those
        // backwards are no boundary), so what it lost there was the rank's accumulation;
        // under its own gradient_accumulation_steps ZeRO reduces each backward's gradient
        // into its partitions, so over several ranks it lost them on the reduction's path.
        None if engine => {
            let marked_by = l.trace.header.boundary_by;
            let stage = if marked_by.is_none() && l.world > 1 { Stage::Reduction } else { Stage::LocalGradient };
            at(s, stage, Numbers::Lost { marked_by })
        }
        None => None,
    }
}

/// Micro-batches a rank runs in a step, as most of the run's steps hold them: a short
/// window at an epoch's end is divided as a full one in one process too.
fn window(l: &Leg) -> Option<f64> {
    let w = l.world as f64;
    median(
        l.trace.facts.stages.iter().filter(|st| !st.batches.is_empty()).map(|st| st.batches.len() as f64 / w).collect(),
    )
    .filter(|k| *k > 0.0)
}

/// Scaling: a window holding fewer micro-batches than the run's windows (an epoch's last)
/// whose every loss was still divided by the full window's count: its gradient is
/// held/k of its samples' mean, in one process as on W ranks (the big batch's finding, read
/// from one run: each window's count against the divisor its losses got).
fn short_window(l: &Leg, s: usize) -> Option<Parting> {
    let rel = factor_rel(l);
    if scales_inside(l.trace) || !l.trace.header.loss_is_mean() || l.batches.iter().any(|b| b.normaliser.is_some()) {
        return None;
    }
    let k = window(l)?;
    let held = l.batches.len() as f64 / l.world as f64;
    (held > 0.0 && held < k && k.fract() == 0.0 && held.fract() == 0.0).then_some(())?;
    let by_k = l.batches.iter().all(|b| b.scaling().is_some_and(|f| near(f * k, 1.0, rel)));
    by_k.then_some(())?;
    at(s, Stage::Scaling, Numbers::WindowDivided { held: held as usize, k: k as usize })
}

/// Scaling: what backward ran on, over the reduction's divide, weighs every micro-batch of
/// the window 1/(K/W · W) = 1/K, as one process dividing each loss by K does. A loss the
/// forward normalised over the window (num_items_in_batch) weighs each item 1/N: the
/// normaliser N where it counts the window over all ranks, or W times it where each rank
/// counts its own N/W items (and DDP averages).
fn scaling(l: &Leg, s: usize) -> Option<Parting> {
    let rel = factor_rel(l);
    // What the roots show is not what reached the gradient there.
    if scales_inside(l.trace) {
        return None;
    }
    let w = l.world as f64;
    // A short window (an epoch's last) is a mean over what it holds (`short_window` names
    // one divided by the full count).
    let held = l.batches.len() as f64 / w;
    let k = window(l).map(|k| if held > 0.0 && held < k { held } else { k })?;
    let normalised = l.batches.iter().all(|b| b.normaliser.is_some());
    // A loss that sums its micro-batch (divided by a count the script made) weighs each
    // item by that count, which one run cannot know: only a mean's scaling is judged.
    if !normalised && !l.trace.header.loss_is_mean() {
        return None;
    }
    let scope = l.trace.header.normaliser_scope;
    let dev = |b: &Batch| -> Option<f64> {
        match normalised {
            true => {
                let (x, n) = (item_weight(b)? / w, b.normaliser?);
                match scope {
                    // The framework's setting says whose items N counts.
                    Some(NormaliserScope::World) => Some(x * n),
                    Some(NormaliserScope::Rank) => Some(x * n * w),
                    // Else the reading nearer its contract: N counted over all ranks, or by each alone.
                    None => [x * n, x * n * w].into_iter().min_by(|p, q| p.ln().abs().total_cmp(&q.ln().abs())),
                }
            }
            false => Some(b.scaling()? * k),
        }
    };
    let apart = l.batches.iter().find_map(|b| {
        let d = dev(b)?;
        (!near(d, 1.0, rel)).then_some((b, d))
    });
    let (b, d) = apart?;
    let sc = b.scaling()?;
    let how = how_scaled(l, sc, d, normalised);
    let numbers = Numbers::Scaling { ratio: d, scales: (sc / d, sc), whole: is_whole(d, rel), how };
    at(s, Stage::Scaling, numbers)
}

/// Reduction: a gradient clipped to max_norm (clip_grad_norm_ found a norm above it) after
/// the ranks' average reaches the optimizer at max_norm, or above it where the clip covered
/// only some of the parameters. Each rank clipping its own gradient before an average makes
/// it smaller: the mean of vectors of norm max_norm has a norm below it unless they are equal.
fn clipped_alone(l: &Leg, s: usize) -> Option<Parting> {
    let t = l.trace;
    if l.world < 2 || t.sampling.is_some() || engine_accumulates(t) {
        return None;
    }
    let (total, max) = t.facts.clip_norms.get(s).copied().flatten()?;
    (total > max * (1.0 + CLIPPED_REL)).then_some(())?;
    let g = t.steps.get(s)?;
    let norm = g.iter().flat_map(|(_, v)| v.to_f64()).map(|x| x * x).sum::<f64>().sqrt();
    (norm < max * (1.0 - CLIPPED_REL)).then_some(())?;
    at(s, Stage::Reduction, Numbers::ClippedBeforeReduction { norm, max })
}
