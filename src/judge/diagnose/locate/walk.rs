//! The walk: at the first step whose gradients diverged, each stage in turn from recorded
//! facts (samples → loss → zeroing → scaling and reduction → local gradient), the first that
//! parts located with its numbers. Silent where a stage's facts were not recorded on both
//! legs (the other locators then speak). It names no owner: `own` does, from the facts of the
//! leg it points at.

use crate::evidence::{Batch, Framework};
use crate::judge::diagnose::measure::factor::is_whole;
use crate::judge::diagnose::measure::legs::{engine_accumulates, fit, how_scaled, matched, ran_backward, Leg};
use crate::judge::diagnose::measure::{median, near, FACTOR_REL};
use crate::judge::diagnose::parting::{Numbers, Parting, Side};
use crate::judge::diagnose::{Evidence, Stage};

/// Relative agreement of two recorded losses of the same inputs and weights.
const LOSS_REL: f64 = 1e-3;

/// The walk, in stage order.
pub fn walk(ev: &Evidence) -> Option<Parting> {
    let s = ev.first?;
    let (a, b) = (Leg::at(ev.a, Side::Left, s)?, Leg::at(ev.b, Side::Right, s)?);
    let masked = masked(&a, &b);
    samples(&a, &b, s)
        .or_else(|| loss(&a, &b, s, masked))
        .or_else(|| zeroed(&a, &b, s))
        .or_else(|| scaled_per_rank(&a, &b, s))
        .or_else(|| scaling_and_reduction(&a, &b, s, masked))
        .or_else(|| if masked { None } else { local_gradient(&a, &b, s) })
}

/// Whether dropout draws masks in either leg (a user's model; ours key theirs by sample):
/// then the losses and gradients of the same samples differ by the masks alone, and the
/// walk reads only what masks cannot move (samples, normalisers, each leg's own divide).
/// Where none of those parts, the Dropout tier names the masks.
fn masked(a: &Leg, b: &Leg) -> bool {
    a.trace.header.dropout.is_some() || b.trace.header.dropout.is_some()
}

/// The facts that decide two runs apart before any number is weighed, at step `s`: at step 0
/// (the same weights) matched micro-batches' losses apart, and at any step each micro-batch's
/// loss reaching the applied gradient weighed otherwise (its scaling over the reduction's
/// divide). Honest runs keep both equal at any W, to their own dtype's rounding.
pub fn facts_at(ev: &Evidence, s: usize) -> Option<Parting> {
    let (a, b) = (Leg::at(ev.a, Side::Left, s)?, Leg::at(ev.b, Side::Right, s)?);
    let masked = masked(&a, &b);
    let decisive = |p: &Parting| matches!(p.numbers, Numbers::LossDiffers { .. } | Numbers::Scaling { .. });
    // The same inputs at the same weights give the same loss where both reach their
    // precision the same way (FSDP2's compute dtype against one process's autocast rounds
    // other ops).
    let same = crate::judge::same_precision(a.trace, b.trace);
    let loss = if s == 0 && same { loss(&a, &b, s, masked).filter(decisive) } else { None };
    loss.or_else(|| scaling_and_reduction(&a, &b, s, masked).filter(decisive))
}

/// How far two legs' recorded loss weights may part by rounding alone: a root and its loss
/// each rounded in the dtype the loss was computed in (bfloat16's loss divided by K rounds at
/// 2^-8; autocast's cross-entropy returns float32; where a trace does not say, the narrowest
/// dtype its leg ran), and the reduction's divide, fitted from gradient sums, in the dtype the
/// gradients were made, kept or reduced in (autocast's are cast back to float32 first; an
/// engine's compute dtype's, a bfloat16 model's or reduction's are not).
fn fact_rel(a: &Leg, b: &Leg) -> f64 {
    let loss = |l: &Leg| l.trace.header.loss_dtype.or_else(|| crate::judge::narrow_dtype(l.trace));
    let grads = |l: &Leg| {
        let h = &l.trace.header;
        [h.dtype, h.compute_dtype, h.reduce_dtype]
            .into_iter()
            .flatten()
            .max_by(|x, y| x.epsilon().total_cmp(&y.epsilon()))
    };
    [a, b].iter().flat_map(|l| [loss(l), grads(l)]).flatten().map(|d| 2.0 * d.epsilon()).fold(FACTOR_REL, f64::max)
}

/// How far the legs' loss weights may part by rounding at step `s` (`fact_rel`), where both
/// legs recorded the step.
pub fn weight_rel(ev: &Evidence, s: usize) -> Option<f64> {
    Some(fact_rel(&Leg::at(ev.a, Side::Left, s)?, &Leg::at(ev.b, Side::Right, s)?))
}

/// The scaling before backward and the reduction alone, at step `s`: what the facts say of
/// a factor clipping hid (the gradients applied agree, so no step parted).
pub fn scaling_at(ev: &Evidence, s: usize) -> Option<Parting> {
    let (a, b) = (Leg::at(ev.a, Side::Left, s)?, Leg::at(ev.b, Side::Right, s)?);
    scaling_and_reduction(&a, &b, s, masked(&a, &b))
}

fn at(s: usize, stage: Stage, leg: Option<Side>, numbers: Numbers) -> Option<Parting> {
    Some(Parting::new(Some(s), Some(stage), leg, numbers))
}

/// Samples: each sample (a row of the inputs) as a multiset over the step, where both legs
/// hashed them: a step's samples grouped otherwise into micro-batches are the same samples,
/// and the grouping is named only where a layer that mixes a micro-batch's samples trains.
/// Else the micro-batches' inputs, as multisets over the step.
fn samples(a: &Leg, b: &Leg, s: usize) -> Option<Parting> {
    if !a.trace.header.samples_comparable(&b.trace.header) {
        return None;
    }
    if let Some(by_sample) = each_sample(a, b, s) {
        return by_sample;
    }
    let (fa, fb) = (a.fingerprints()?, b.fingerprints()?);
    if fa == fb {
        return None;
    }
    let unseen = |f: &u64| fa.binary_search(f).is_err();
    let missing = b.batches.iter().enumerate().find(|(_, x)| x.fingerprint.as_ref().is_some_and(unseen));
    let missing = missing.map(|(i, x)| (x.rank, b.batches[..i].iter().filter(|y| y.rank == x.rank).count() + 1));
    let differ = fb.iter().filter(|f| unseen(f)).count();
    let numbers = Numbers::DifferentInputs { missing, differ, total: fb.len(), samples: None };
    at(s, Stage::Samples, Some(b.side), numbers)
}

/// The samples stage by each sample: None where either leg did not hash its samples, else
/// the stage's finding (Some(None): the same samples, and no layer couples their grouping).
fn each_sample(a: &Leg, b: &Leg, s: usize) -> Option<Option<Parting>> {
    let every = a.every()?.max(b.every()?);
    let (sa, sb) = (a.samples(every)?, b.samples(every)?);
    if sa == sb {
        let regrouped = a.fingerprints().zip(b.fingerprints()).is_some_and(|(x, y)| x != y);
        let coupled = b.trace.header.coupled.clone().or_else(|| a.trace.header.coupled.clone());
        return Some(match (regrouped, coupled) {
            (true, Some(layers)) => at(s, Stage::Samples, Some(b.side), Numbers::Regrouped { layers }),
            _ => None,
        });
    }
    // b's samples a lacks, counted as a multiset.
    let mut left = sa.clone();
    let mut unseen = |h: &u64| match left.binary_search(h) {
        Ok(i) => {
            left.remove(i);
            false
        }
        Err(_) => true,
    };
    let mut missing = None;
    let mut differ = 0;
    let mut nth: std::collections::BTreeMap<usize, usize> = Default::default();
    for x in b.batches {
        let n = nth.entry(x.rank).or_default();
        *n += 1;
        let own = b.samples_of(x, every)?;
        let count = own.iter().filter(|h| unseen(h)).count();
        if count > 0 && missing.is_none() {
            missing = Some((x.rank, *n));
        }
        differ += count;
    }
    if differ == 0 {
        // b's samples are all a's, yet fewer: a saw more.
        differ = sa.len() - sb.len();
    }
    let numbers = Numbers::DifferentInputs { missing, differ, total: sb.len().max(sa.len()), samples: Some(every) };
    Some(at(s, Stage::Samples, Some(b.side), numbers))
}

/// Gradients zeroed inside a window: the micro-batches before it never reach the step.
fn zeroed(a: &Leg, b: &Leg, s: usize) -> Option<Parting> {
    let (leg, times) = [a, b].into_iter().find_map(|l| {
        let n = l.trace.facts.stages.get(s).map_or(0, |st| st.zeroed);
        (n > 0).then_some((l, n))
    })?;
    at(s, Stage::LocalGradient, Some(leg.side), Numbers::ZeroedInWindow { times })
}

/// Loss: the same inputs gave different losses: divided by different token counts, or
/// computed otherwise; at step 0, where both runs start from the same weights, a process's
/// first micro-batch alike and its later ones apart: the weights moved inside the window.
/// Under dropout (`masked`) only the normalisers are read: the losses differ by the masks.
fn loss(a: &Leg, b: &Leg, s: usize, masked: bool) -> Option<Parting> {
    let pairs = matched(a.batches, b.batches);
    if masked {
        return pairs.iter().find_map(|(x, y)| normaliser_apart(a, b, x, y, s));
    }
    if pairs.is_empty() {
        return step_mean_apart(a, b, s);
    }
    let apart_by = |x: &Batch, y: &Batch, rel: f64| match (x.loss(), y.loss()) {
        (Some(l), Some(m)) => !near(l, m, rel),
        _ => false,
    };
    let apart = |x: &Batch, y: &Batch| apart_by(x, y, LOSS_REL);
    if s == 0 {
        // Weights that move after each micro-batch part a pair exactly where the two
        // processes had made a different number of micro-batches before it: every pair at
        // the same place in its process's window alike, every other pair apart (a loss of
        // one rank's own parts that rank's pairs wherever they stand).
        // The same kernels on the same inputs and weights give the same bits: a weight moved
        // by weight decay at a fine-tuning rate parts a loss by an ulp or two.
        let apart = |x: &Batch, y: &Batch| apart_by(x, y, 0.0);
        let place = |l: &Leg, x: &Batch| l.batches.iter().filter(|y| y.rank == x.rank).position(|y| std::ptr::eq(y, x));
        let (same, other): (Vec<_>, Vec<_>) = pairs.iter().partition(|(x, y)| place(a, x) == place(b, y));
        let moved = !same.is_empty()
            && !other.is_empty()
            && same.iter().all(|(x, y)| !apart(x, y))
            && other.iter().all(|(x, y)| apart(x, y));
        if let Some((x, y)) = other.first().filter(|_| moved) {
            let losses = (x.loss()?, y.loss()?);
            return at(s, Stage::Update, None, Numbers::MovedInWindow { losses, rank: y.rank });
        }
    }
    let (x, y) = pairs.iter().find(|(x, y)| apart(x, y))?;
    let losses = (x.loss()?, y.loss()?);
    if let Some(p) = normaliser_apart(a, b, x, y, s) {
        return Some(p);
    }
    // One ratio for every micro-batch is a scaling inside the forward (a framework making up
    // for the ranks' averaging), judged with the scaling.
    let ratios: Vec<f64> = pairs.iter().filter_map(|(x, y)| Some(y.loss()? / x.loss()?)).collect();
    if ratios.iter().all(|r| near(*r, ratios[0], LOSS_REL)) {
        return None;
    }
    at(s, Stage::Loss, None, Numbers::LossDiffers { losses, rank: Some(y.rank) })
}

/// At step 0, where no micro-batch of one leg holds another's inputs but both hold the same
/// samples in micro-batches of one size (a strided sampler against consecutive batches),
/// with no layer that mixes a micro-batch's samples and no normaliser handed to the forward:
/// each sample's loss is the same in either grouping, so the mean over the step's
/// micro-batches of their means (or sums, all of one size) is too, to the rounding of the
/// loss dtype each leg recorded (16 of its epsilons).
fn step_mean_apart(a: &Leg, b: &Leg, s: usize) -> Option<Parting> {
    let alike = |l: &Leg| l.trace.header.coupled.is_none() && l.batches.iter().all(|x| x.normaliser.is_none());
    let comparable = a.trace.header.samples_comparable(&b.trace.header);
    if s != 0 || !comparable || !alike(a) || !alike(b) || !same_sizes(a, b) || a.samples(1)? != b.samples(1)? {
        return None;
    }
    let rel =
        [a, b].iter().map(|l| l.trace.header.loss_dtype.map(|d| 16.0 * d.epsilon())).collect::<Option<Vec<_>>>()?;
    let mean = |l: &Leg| -> Option<f64> {
        let v: Vec<f64> = l.batches.iter().map(Batch::loss).collect::<Option<_>>()?;
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    let (ma, mb) = (mean(a)?, mean(b)?);
    let rel = rel.into_iter().fold(0.0, f64::max);
    (!near(ma, mb, rel)).then_some(())?;
    at(s, Stage::Loss, None, Numbers::LossDiffers { losses: (ma, mb), rank: None })
}

/// A matched pair divided by other normalisers, unless the scaling and the reduction's divide
/// make up for it: each rank counting its own items (N/W of them, when the ranks hold as
/// many) and the ranks' average weigh each item 1/N, as one process dividing by N does.
fn normaliser_apart(a: &Leg, b: &Leg, x: &Batch, y: &Batch, s: usize) -> Option<Parting> {
    let (nx, ny) = (x.normaliser?, y.normaliser?);
    if near(nx, ny, 1e-9) {
        return None;
    }
    // What each item of the micro-batch weighs in the applied gradient, per leg.
    let weight = |l: &Leg, z: &Batch, n: f64| Some(z.scaling()? / (n * l.divide().unwrap_or(l.world as f64)));
    if let (Some(wx), Some(wy)) = (weight(a, x, nx), weight(b, y, ny)) {
        if near(wx, wy, FACTOR_REL) {
            return None;
        }
    }
    let losses = (x.loss()?, y.loss()?);
    let numbers = Numbers::NormaliserPerRank { losses, normalisers: (nx, ny), rank: y.rank };
    at(s, Stage::Loss, Some(b.side), numbers)
}

/// Each parameter's local sum over the ranks at step `s`, undone of the loss's scaling
/// before backward, in both legs; None where either leg lacks them.
fn unscaled_locals(a: &Leg, b: &Leg, s: usize) -> Option<Vec<(String, f64, f64)>> {
    let (sa, sb) = (a.root_scale()?, b.root_scale()?);
    let (la, lb) = (a.local_at(s)?, b.local_at(s)?);
    let out: Vec<_> = la.iter().filter_map(|(n, &x)| Some((n.clone(), x / sa, lb.get(n)? / sb))).collect();
    (!out.is_empty()).then_some(out)
}

/// Local gradient: the same losses, scaled alike, gave other gradients before any reduction
/// (each parameter's local sum over ranks, undone of its scaling).
fn local_gradient(a: &Leg, b: &Leg, s: usize) -> Option<Parting> {
    let locals = unscaled_locals(a, b, s)?;
    let peak = locals.iter().fold(0.0f64, |m, (_, x, _)| m.max(x.abs()));
    let (param, x, y) = locals.into_iter().find(|(_, x, y)| (x - y).abs() > 1e-3 * peak)?;
    at(s, Stage::LocalGradient, None, Numbers::LocalDiffers { param, sums: (x, y) })
}

/// A normaliser of the rank's own: in one leg every micro-batch's loss is scaled alike (one
/// count for the step) while the other's ranks scale theirs by another factor each (a count
/// over the rank's own micro-batches), so the ranks' average is not the step's mean.
fn scaled_per_rank(a: &Leg, b: &Leg, s: usize) -> Option<Parting> {
    let alike = |l: &Leg| {
        let v: Vec<f64> = l.batches.iter().filter_map(Batch::scaling).collect();
        !v.is_empty() && v.iter().all(|x| near(*x, v[0], FACTOR_REL))
    };
    let per_rank = |l: &Leg| -> Option<Vec<(usize, f64)>> {
        let by = l.scaling_per_rank()?;
        (l.world > 1 && by.len() > 1 && by.iter().any(|(_, f)| !near(*f, by[0].1, FACTOR_REL))).then_some(by)
    };
    let (leg, other) = if alike(a) { (b, a) } else { (a, b) };
    let scales = per_rank(leg)?;
    alike(other).then_some(())?;
    let one = other.scaling()?;
    at(s, Stage::Scaling, Some(leg.side), Numbers::ScaledPerRank { scales, one })
}

/// Scaling inside backward: the local sums' ratio between the legs is not the ratio of the
/// values backward ran on (matched micro-batches' roots), so a backward that a framework ran
/// scaled the gradients itself (a hook of its own), one factor over every parameter. Judged
/// before the roots' scaling, which cannot see it; by the roots themselves, not by what
/// peeling their graphs finds (a normaliser peels in one leg's graph and not the other's).
fn scaled_in_backward(a: &Leg, b: &Leg, s: usize) -> Option<Parting> {
    let (la, lb) = (a.local_at(s)?, b.local_at(s)?);
    let pairs: Vec<(f64, f64)> = la.iter().filter_map(|(n, &x)| Some((*lb.get(n)?, x))).collect();
    let local = fit(&pairs)?;
    let roots = median(matched(a.batches, b.batches).iter().filter_map(|(x, y)| Some(y.root? / x.root?)).collect())?;
    if near(local, roots, FACTOR_REL) {
        return None;
    }
    let leg = if ran_backward(b.trace).is_some() { b } else { a };
    ran_backward(leg.trace).filter(|f| *f != Framework::Plain)?;
    at(s, Stage::Scaling, Some(leg.side), Numbers::ScaledInBackward { ratio: local / roots })
}

/// Scaling before backward and the reduction, judged together: each micro-batch's loss
/// reaches the applied gradient multiplied by scaling / divide, which both legs must share.
fn scaling_and_reduction(a: &Leg, b: &Leg, s: usize, masked: bool) -> Option<Parting> {
    let (sa, sb) = (a.scaling()?, b.scaling()?);
    let (da, db) = (a.divide(), b.divide());
    // A reduction that does not average (measured) is the engine's, whatever the scaling;
    // one process has none, unless an engine accumulates for it (DeepSpeed's). Measured
    // from gradients a lower compute dtype rounded (bfloat16's local sums against its fp32
    // accumulator): apart by more than that rounding.
    for (leg, d) in [(b, db), (a, da)] {
        let w = leg.world as f64;
        let rel = FACTOR_REL.max(4.0 * crate::judge::narrow_dtype(leg.trace).map_or(0.0, |t| t.epsilon()));
        if let Some(d) = d.filter(|&d| (leg.world > 1 || engine_accumulates(leg.trace)) && !near(d, w, rel)) {
            let configured = leg.trace.header.grad_divide.is_some_and(|f| !near(f, w, 1e-9));
            let numbers = Numbers::Reduction { divide: d, world: leg.world, configured };
            return at(s, Stage::Reduction, Some(leg.side), numbers);
        }
    }
    // No divide fits: an engine's own accumulation lost micro-batches (one process first:
    // there nothing is reduced, so the ranks' reduction is judged against a sound one). Over
    // several ranks the applied gradient is the reduction's; in one process, the
    // accumulation's alone.
    for (leg, d) in [(a, da), (b, db)] {
        if d.is_none() && engine_accumulates(leg.trace) && leg.has_local() {
            let stage = if leg.world > 1 { Stage::Reduction } else { Stage::LocalGradient };
            return at(s, stage, Some(leg.side), Numbers::Lost { marked_by: leg.trace.header.boundary_by });
        }
    }
    // Under dropout the roots differ by the masks, and a scaling over its normaliser misses
    // what a framework multiplies in between (Trainer's W): no ratio is read.
    if masked {
        return None;
    }
    if let Some(p) = scaled_in_backward(a, b, s) {
        return Some(p);
    }
    let (da, db) = (da.unwrap_or(1.0), db.unwrap_or(b.world as f64));
    // Each matched micro-batch's root reaches the applied gradient divided by the reduction;
    // where none match (the same samples grouped otherwise), each leg's one scaling of
    // micro-batches alike in size.
    let ratio = median(
        matched(a.batches, b.batches).iter().filter_map(|(x, y)| Some((y.root? / db) / (x.root? / da))).collect(),
    )
    .or_else(|| Some((uniform(b)? / db) / (uniform(a)? / da)).filter(|_| same_sizes(a, b)))?;
    if near(ratio, 1.0, fact_rel(a, b)) {
        return None;
    }
    scaling(a, b, (sa, sb), ratio, s)
}

/// One scaling of every micro-batch's loss in a leg; None where they differ.
fn uniform(l: &Leg) -> Option<f64> {
    let v: Vec<f64> = l.batches.iter().map(Batch::scaling).collect::<Option<_>>()?;
    v.iter().all(|x| near(*x, v[0], FACTOR_REL)).then(|| v[0])
}

/// Every micro-batch of both legs hashed the same number of samples, all of them: a mean
/// loss per micro-batch weighs each sample alike in either grouping.
fn same_sizes(a: &Leg, b: &Leg) -> bool {
    let sizes: Option<Vec<(usize, u64)>> =
        a.batches.iter().chain(b.batches).map(|x| x.rows.map(|r| (r.count, r.every))).collect();
    sizes.is_some_and(|v| !v.is_empty() && v.iter().all(|&(n, e)| n == v[0].0 && e == 1))
}

/// Whether a leg's losses follow the normaliser its forward was passed (a loss normalised
/// over the window): not where a micro-batch of the same inputs in the other leg was passed
/// another normaliser and returned the same loss (a model that takes num_items_in_batch and
/// returns its own mean: nothing then divides the loss by the window), nor where the loss
/// was recorded a mean.
fn follows_normaliser(l: &Leg, other: &Leg) -> bool {
    // A loss whose graph shows a mean over its micro-batch under its constant factors
    // follows no count it was passed (a model that takes num_items_in_batch and drops it).
    if !l.batches.iter().any(|x| x.normaliser.is_some()) || l.trace.header.loss_is_mean() {
        return false;
    }
    let pairs = matched(l.batches, other.batches);
    let ignored = pairs.iter().any(|(x, y)| match (x.normaliser, y.normaliser, x.loss(), y.loss()) {
        (Some(nx), Some(ny), Some(lx), Some(ly)) => !near(nx, ny, 1e-2) && near(lx, ly, LOSS_REL),
        _ => false,
    });
    !ignored
}

/// The loss was scaled differently before backward: which leg, by whom, and which way.
fn scaling(a: &Leg, b: &Leg, scales: (f64, f64), ratio: f64, s: usize) -> Option<Parting> {
    // What a leg's scaling should be: 1/k (a mean per micro-batch, k per rank), or where the
    // forward's loss follows a normaliser over the window (Trainer's num_items_in_batch) none,
    // or W on each of W ranks (making up for the ranks' averaging).
    let expected = |l: &Leg, other: &Leg| match follows_normaliser(l, other) {
        true => l.world as f64,
        false => 1.0 / l.per_rank(),
    };
    let (dev_a, dev_b) = (scales.0 / expected(a, b), scales.1 / expected(b, a));
    let (leg, sc, dev) = if dev_a.ln().abs() > dev_b.ln().abs() { (a, scales.0, dev_a) } else { (b, scales.1, dev_b) };
    let normalised = follows_normaliser(leg, if leg.side == a.side { b } else { a });
    let how = how_scaled(leg, sc, dev, normalised);
    let numbers = Numbers::Scaling { ratio, scales, whole: is_whole(ratio, FACTOR_REL), how };
    at(s, Stage::Scaling, Some(leg.side), numbers)
}
