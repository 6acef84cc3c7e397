//! Accumulation against one big batch of each step's samples: where DDP agrees with
//! accumulation, a mismatch here is a normalisation both runs share (a per-micro-batch mean,
//! a wrong count), not a sampler's.

use super::factor::fitted_ratio;
use super::{clipping, dropout, Context, Diagnosis, Evidence, Loss, Rule, RULES};
use crate::evidence::Trace;
use crate::judge::{Agreement, Comparison, Reason};

/// Asked first, where DDP and accumulation agree and both runs made the same steps.
const SHARED: &[Rule] = &[
    Rule { name: "clip count", test: clipping::clip_count },
    Rule { name: "dropout keys", test: dropout::keys },
    Rule { name: "user's dropout", test: dropout::users },
    Rule { name: "short window", test: short_window },
    Rule { name: "token count", test: token_count },
    Rule { name: "loss scaling", test: loss_scaling },
    Rule { name: "per-micro-batch mean", test: per_micro_batch_mean },
];

/// `runs_agree`: accumulation and DDP were found equivalent, so a mismatch here is a
/// mistake both make alike. Otherwise, and where none of those speaks, the rules that judge
/// accumulation against DDP (chaos aside: one process against one process).
pub fn big_batch(a: &Trace, b: &Trace, c: &Comparison, cx: &Context, runs_agree: bool) -> Option<Diagnosis> {
    if c.verdict != Agreement::Diverged {
        return None;
    }
    let cx = Context { chaos_possible: false, ..*cx };
    let ev = Evidence::new(a, b, c, &cx);
    let shared = (c.left_steps == c.right_steps && runs_agree && ev.grads().is_some()).then_some(SHARED);
    shared.into_iter().chain([RULES]).flatten().find_map(|r| (r.test)(&ev))
}

/// Accumulation's gradients as one factor of the big batch's.
fn factor(ev: &Evidence) -> Option<(usize, f64)> {
    let (s, (x, y)) = (ev.first?, ev.grads()?);
    Some((s, fitted_ratio(y, x, ev.cx.eps)?))
}

/// The short window at an epoch's end divided as if it held K micro-batches.
fn short_window(ev: &Evidence) -> Option<Diagnosis> {
    let (s, r) = factor(ev)?;
    ev.cx.first_short.filter(|w| w.step == s && (r - w.fraction).abs() <= 1e-3 * w.fraction)?;
    Diagnosis::new(
        Reason::ShortWindowScaling,
        format!(
            "accumulation agrees with the big batch until step {s}, the short window at an epoch's end, whose \
             gradient is {r:.3}x the big batch's: its loss is divided as if it held K micro-batches; divide by \
             what the window holds (its micro-batches, or its tokens)"
        ),
    )
}

fn token_count(ev: &Evidence) -> Option<Diagnosis> {
    let (s, r) = factor(ev).filter(|_| ev.cx.loss == Loss::PerToken)?;
    Diagnosis::new(
        Reason::TokenCount,
        format!(
            "from step {s} accumulation's gradients are {r:.4}x the big batch's, one factor per step: the loss is \
             divided by the wrong number of tokens; count the targets (labels != -100, after the causal shift) \
             over every micro-batch of the step and every rank"
        ),
    )
}

fn loss_scaling(ev: &Evidence) -> Option<Diagnosis> {
    let (s, r) = factor(ev)?;
    Diagnosis::new(
        Reason::LossScaling,
        format!(
            "from step {s} accumulation's gradients are {r:.3}x the big batch's, one factor per step: loss \
             scaling (each micro-batch's loss must be divided by K, by K/W on each rank)"
        ),
    )
}

/// No one factor, though DDP and accumulation agree: each micro-batch normalised by its own
/// count (or, in a user's loop, a loss that couples a batch's samples).
fn per_micro_batch_mean(ev: &Evidence) -> Option<Diagnosis> {
    let s = ev.first?;
    if factor(ev).is_some() || (ev.cx.loss != Loss::PerToken && ev.cx.ours()) {
        return None;
    }
    let users = match ev.cx.ours() {
        true => "",
        false => {
            " (Transformers PR 34191: pass num_items_in_batch on to the loss); or the loss couples the \
             samples of a batch (a contrastive loss's in-batch negatives, BatchNorm's statistics), which one \
             big batch computes over all of them: then DDP matches accumulation, not a larger batch, unless \
             the ranks gather their samples"
        }
    };
    Diagnosis::new(
        Reason::PerMicroBatchMean,
        format!(
            "step {s} differs from the big batch by more than rounding and not by one factor, though DDP and \
             accumulation agree: each micro-batch's loss is averaged over its own tokens (or samples) and then \
             divided by K, so tokens of short micro-batches weigh more; sum the per-token losses and divide by \
             the step's token count (over all micro-batches and ranks){users}"
        ),
    )
}
