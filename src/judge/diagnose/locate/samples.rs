//! Samples: how the data was dealt (the recorded deal), and which samples, counted how,
//! made the first differing step where no factor explains it.

use crate::evidence::TraceHeader;
use crate::judge::diagnose::measure::legs::Leg;
use crate::judge::diagnose::parting::{Deal, Numbers, Parting, Side};
use crate::judge::diagnose::{Evidence, Loss, Pair, Stage};

/// An epoch cut short by the plan a framework made: fewer optimizer steps than each epoch's
/// windows (its partial last one included), so those batches never reach a step. Between two
/// runs, only in the leg that stepped fewer times (a plan both legs share parts neither);
/// in one run, the recorded plan alone.
pub fn epoch_cut_short(ev: &Evidence) -> Option<Parting> {
    let one_run = matches!(ev.pair, Pair::OneRun);
    [(ev.a, ev.b, Side::Left), (ev.b, ev.a, Side::Right)].into_iter().find_map(|(t, other, side)| {
        let h = &t.header;
        let (steps, loader, k, epochs) =
            (h.planned_steps?, h.planned_loader?, h.planned_accumulation?, h.planned_epochs?);
        (k > 0 && epochs >= 1.0 && epochs.fract() == 0.0 && loader % k != 0).then_some(())?;
        let epochs = epochs as usize;
        (steps < loader.div_ceil(k).saturating_mul(epochs)).then_some(())?;
        (one_run || h.steps.zip(other.header.steps).is_some_and(|(x, y)| x < y)).then_some(())?;
        let numbers = Numbers::EpochCutShort { steps, loader, accumulation: k, epochs, left: loader % k };
        Some(Parting::new(ev.first, Some(Stage::Samples), Some(side), numbers))
    })
}

/// The data dealt unevenly, by the legs' recorded facts: a DistributedSampler that padded or
/// dropped samples in one leg and not the other, or loaders that dropped or shortened other
/// last batches (what `explore` meets at N off a multiple of W or of W·B). Not where the
/// first difference comes before the epoch's end.
pub fn uneven_data(ev: &Evidence) -> Option<Parting> {
    let (a, b) = (&ev.a.header, &ev.b.header);
    let same_steps = a.steps.is_some() && a.steps == b.steps;
    if let (Some(s), Some(e), true) = (ev.first, ev.cx.steps_per_epoch, same_steps) {
        if s + 1 < e {
            return None;
        }
    }
    if ev.first.is_some_and(|s| same_samples_at(ev, s) == Some(true) && equal_batches_at(ev, s)) {
        return None; // the deal parted no sample, nor a micro-batch's size, of the first step that parts
    }
    let (side, deal) = dealt_apart(a, b)?;
    Some(Parting::new(None, Some(Stage::Samples), side, Numbers::DealtUnevenly(deal)))
}

/// Whether every micro-batch of both legs at step `s` hashed as many samples (a short batch
/// weighs its samples more).
fn equal_batches_at(ev: &Evidence, s: usize) -> bool {
    let sizes = |t| Leg::at(t, Side::Left, s).map(|l| l.batches.iter().map(|b| b.rows.map(|r| r.count)).collect());
    let (x, y): (Option<Vec<_>>, Option<Vec<_>>) = (sizes(ev.a), sizes(ev.b));
    let all: Vec<Option<usize>> = x.into_iter().chain(y).flatten().collect();
    !all.is_empty() && all.iter().all(|n| n.is_some() && *n == all[0])
}

/// Whether both legs' recorded samples at step `s` are the same: each sample (hashed), else
/// each micro-batch's inputs; None where either leg did not record them.
fn same_samples_at(ev: &Evidence, s: usize) -> Option<bool> {
    let (a, b) = (Leg::at(ev.a, Side::Left, s)?, Leg::at(ev.b, Side::Right, s)?);
    if !ev.a.header.samples_comparable(&ev.b.header) {
        return None;
    }
    let every = a.every().zip(b.every()).map(|(x, y)| x.max(y));
    let by_sample = every.and_then(|e| Some(a.samples(e)? == b.samples(e)?));
    by_sample.or_else(|| a.fingerprints().zip(b.fingerprints()).map(|(x, y)| x == y))
}

/// Where the legs' deals differ, and the leg that did more of it.
fn dealt_apart(a: &TraceHeader, b: &TraceHeader) -> Option<(Option<Side>, Deal)> {
    let n = |x: Option<usize>| x.unwrap_or(0);
    let world = b.world_size.max(a.world_size).unwrap_or(2);
    // The leg that did more of something, and its header.
    let more = |x: usize, y: usize| if x > y { (Side::Left, a) } else { (Side::Right, b) };
    let (pa, pb) = (n(a.sampler_padded), n(b.sampler_padded));
    if pa != pb {
        let (who, h) = more(pa, pb);
        let deal = Deal::Padded {
            samples: pa.max(pb),
            dataset: h.sampler_dataset,
            repeated: h.sampler_repeated.clone(),
            world,
        };
        return Some((Some(who), deal));
    }
    let (da, db) = (n(a.sampler_dropped), n(b.sampler_dropped));
    if da != db {
        let (who, h) = more(da, db);
        return Some((Some(who), Deal::SamplerDropped { samples: da.max(db), dataset: h.sampler_dataset, world }));
    }
    let (ka, kb) = (n(a.loader_dropped), n(b.loader_dropped));
    if ka != kb {
        return Some((None, Deal::LoaderDropped { left: ka, right: kb }));
    }
    let (sa, sb) = (n(a.short_batches), n(b.short_batches));
    (sa != sb).then_some((None, Deal::ShortBatches { left: sa, right: sb }))
}

/// The same samples in every step yet more than rounding apart, and not by one factor: a
/// count is off by whole tokens, percents of it (the same samples regrouped, a bug that only
/// reorders sums, differ by rounding).
pub fn token_count_per_rank(ev: &Evidence) -> Option<Parting> {
    let s = ev.first?;
    let cx = ev.cx;
    if cx.loss != Loss::PerToken || cx.same_samples != Some(true) || ev.c.steps[s].max_rel <= 1e-3 {
        return None;
    }
    Some(Parting::new(Some(s), Some(Stage::Loss), None, Numbers::TokenCountPerRank))
}

/// The first difference comes in a later epoch: the shuffle differs between epochs.
pub fn epoch(ev: &Evidence) -> Option<Parting> {
    let s = ev.first?;
    let epoch = ev.cx.steps_per_epoch.map_or(0, |n| s / n.max(1));
    (epoch > 0).then(|| Parting::new(Some(s), Some(Stage::Samples), None, Numbers::Epoch { epoch }))
}

/// What is left: other samples in the step. Not where both legs recorded their samples (each
/// sample, or each micro-batch's inputs) and they are the same: that fact refutes the guess.
pub fn different_samples(ev: &Evidence) -> Option<Parting> {
    let s = ev.first?;
    if same_samples_at(ev, s) == Some(true) || !ev.a.header.samples_comparable(&ev.b.header) {
        return None;
    }
    Some(Parting::new(Some(s), Some(Stage::Samples), None, Numbers::DifferentSamples))
}
