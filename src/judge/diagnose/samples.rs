//! Samples: which samples, counted how, made the first differing step, where no factor
//! explains it.

use super::stages::{Located, Stage};
use super::{Diagnosis, Evidence, Loss};
use crate::evidence::TraceHeader;
use crate::judge::Reason;

/// The same samples in every step yet more than rounding apart, and not by one factor: a
/// count is off by whole tokens, percents of it (the same samples regrouped, a bug that only
/// reorders sums, differ by rounding).
pub fn token_count_per_rank(ev: &Evidence) -> Option<Diagnosis> {
    let s = ev.first?;
    let cx = ev.cx;
    if cx.loss != Loss::PerToken || cx.same_samples != Some(true) || ev.c.steps[s].max_rel <= 1e-3 {
        return None;
    }
    Diagnosis::new(
        Reason::TokenCountPerRank,
        format!(
            "the runs see the same samples in every step, yet step {s} differs by more than rounding and not by one \
             factor: they divide by different token counts; each rank must divide by the step's count over all \
             ranks (all-reduce it before backward), not by its own"
        ),
    )
}

/// The first difference comes in a later epoch: the shuffle differs between epochs.
pub fn epoch(ev: &Evidence) -> Option<Diagnosis> {
    let s = ev.first?;
    let epoch = ev.cx.steps_per_epoch.map_or(0, |n| s / n.max(1));
    (epoch > 0).then(|| Diagnosis {
        reason: Reason::EpochDependentSampling,
        located: None,
        detail: format!(
            "the runs agree through epoch {} and first differ in epoch {epoch} (step {s}): the shuffle differs \
             between epochs; is set_epoch(epoch) called on every rank's sampler?",
            epoch - 1
        ),
    })
}

/// What is left: other samples in the step.
pub fn different_samples(ev: &Evidence) -> Option<Diagnosis> {
    let s = ev.first?;
    Diagnosis::new(
        Reason::DifferentSamples,
        format!(
            "step {s} differs by more than rounding and not by a constant factor: the runs likely see different \
             samples in that step (strided vs contiguous split, padding)"
        ),
    )
}

/// The data dealt unevenly, by the legs' recorded facts: a DistributedSampler that padded or
/// dropped samples in one leg and not the other, or loaders that dropped or shortened other
/// last batches (what `explore` meets at N off a multiple of W or of W·B). The script's, at
/// the samples stage: where the first difference comes before the epoch's end it is not.
pub fn uneven_data(ev: &Evidence) -> Option<Diagnosis> {
    let (a, b) = (&ev.a.header, &ev.b.header);
    let same_steps = a.steps.is_some() && a.steps == b.steps;
    if let (Some(s), Some(e), true) = (ev.first, ev.cx.steps_per_epoch, same_steps) {
        if s + 1 < e {
            return None;
        }
    }
    // A framework that shards the loader deals the DDP leg's batches (Accelerate's
    // even_batches pads them): its documented behaviour, owned by it, fixed by its settings.
    let (owner, _) = super::stages::dealer(ev.b);
    let library = owner.is_library().then(|| owner.describe());
    let detail = dealt_apart(a, b, ev.left(), ev.right(), library.as_deref())?;
    Some(Diagnosis {
        reason: Reason::UnevenData,
        detail,
        located: Some(Located { stage: Stage::Samples, owner, known_fix: None }),
    })
}

/// Where the legs' deals differ, in words, with the fix.
fn dealt_apart(a: &TraceHeader, b: &TraceHeader, la: &str, lb: &str, library: Option<&str>) -> Option<String> {
    let n = |x: Option<usize>| x.unwrap_or(0);
    let of = |h: &TraceHeader| h.sampler_dataset.map_or(String::new(), |d| format!(" of N={d}"));
    let w = b.world_size.max(a.world_size).unwrap_or(2);
    let per_rank = "deal the one-process run as W ranks of DistributedSampler would \
                    (ddp_verify_trace.AccumulationBatchSampler)";
    // The leg that did more of something, its header, and the other's label.
    let more = |x: usize, y: usize| if x > y { (la, a, lb) } else { (lb, b, la) };
    let (pa, pb) = (n(a.sampler_padded), n(b.sampler_padded));
    if pa != pb {
        let (who, h, other) = more(pa, pb);
        let which = h.sampler_repeated.as_deref().map_or(String::new(), |r| format!(" (data set indices {r})"));
        if let Some(lib) = library {
            return Some(format!(
                "{who}'s batches, dealt by {lib}, padded the data set{} with {} sample(s) repeated from the epoch's \
                 start so that every rank's last batch is full (Accelerate's even_batches, its default): {who} \
                 trains on them twice each epoch, {other} once. Keep N a multiple of W·B; \
                 dataloader_drop_last=True (Trainer) or even_batches=False (Accelerator) stops the repeating \
                 but leaves out a last round that one process still trains on",
                of(h),
                pa.max(pb)
            ));
        }
        return Some(format!(
            "{who}'s sampler padded the data set{} with {} repeated sample(s){which} so that its {w} shards are \
             equal (DistributedSampler's default drop_last=False): {who} trains on them twice each epoch, {other} \
             once. Keep N a multiple of W, {per_rank}, or pass drop_last=True and leave as many out of both runs",
            of(h),
            pa.max(pb)
        ));
    }
    let (da, db) = (n(a.sampler_dropped), n(b.sampler_dropped));
    if da != db {
        let (who, h, other) = more(da, db);
        return Some(format!(
            "{who}'s DistributedSampler(drop_last=True) left out {} sample(s){} each epoch so that its {w} shards \
             are equal; {other} trains on them. Keep N a multiple of W, or {per_rank} with drop_last=True",
            da.max(db),
            of(h)
        ));
    }
    let (ka, kb) = (n(a.loader_dropped), n(b.loader_dropped));
    if ka != kb {
        return Some(format!(
            "the data loaders' drop_last left out {ka} sample(s) per epoch in {la} and {kb} in {lb}: each rank \
             drops the short last batch of its own shard, one process only that of the whole data set. Make N a \
             multiple of W·B, or {per_rank}"
        ));
    }
    let (sa, sb) = (n(a.short_batches), n(b.short_batches));
    if sa != sb {
        return Some(format!(
            "{la} ends each epoch with {sa} micro-batch(es) shorter than the batch size and {lb} with {sb}: each \
             rank's shard leaves a short last batch of its own, and a short batch's mean weighs each of its \
             samples more than a full one's. Make N a multiple of W·B, {per_rank}, or pass drop_last=True to \
             both loaders alike"
        ));
    }
    None
}
