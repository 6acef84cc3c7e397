//! Words for the first differing step's shape (a stale gradient, one factor, a count, an
//! epoch, other samples), for a mistake both runs share against the big batch, and for the
//! cautions beside an equivalence.

use super::update::growth_words;
use super::{loss_scaling_fix, step};
use crate::judge::diagnose::parting::{Numbers, Parting, Side};
use crate::judge::diagnose::source::Words;
use crate::judge::size_words;

pub fn advice(p: &Parting, w: &Words) -> Option<String> {
    let (l, r) = (w.left, w.right);
    let side = w.label(p.leg.unwrap_or(Side::Right));
    let s = step(p);
    let words = match &p.numbers {
        Numbers::Stale => format!(
            "{side}'s gradient at step {s} is step {}'s plus this step's: gradients are not zeroed after \
             optimizer.step()",
            s.saturating_sub(1)
        ),
        Numbers::ClippedFactor { ratio, before, whole, norm: (total, max) } => {
            let what = match whole {
                true => format!("exactly {before:.2}x before clipping: {}", loss_scaling_fix(w)),
                false => format!("{before:.4}x before clipping"),
            };
            format!(
                "{r} gradients are a uniform {ratio:.4}x {l}'s at step {s}, and clipping ran on {side} only (norm \
                 {total:.4} over max_norm {max}): {what}; clipping hides the factor, it does not remove it"
            )
        }
        Numbers::OneFactor { ratio, whole: true, adam } => {
            let adam = match adam {
                true => {
                    "; under AdamW the weights barely show it (Adam divides by √v, so a gradient K times too large \
                     makes almost the same step), which is why the gradients are compared"
                }
                false => "",
            };
            format!("{r} gradients are exactly {ratio:.2}x {l}'s from step {s}: {}{adam}", loss_scaling_fix(w))
        }
        Numbers::OneFactor { ratio, .. } => format!(
            "{r} gradients are a uniform {ratio:.4}x {l}'s in every tensor at step {s}: the same samples, scaled \
             differently (a loss or gradient multiplied by a factor in one run only)"
        ),
        Numbers::TokenCountPerRank => format!(
            "the runs see the same samples in every step, yet step {s} differs by more than rounding and not by one \
             factor: they divide by different token counts; each rank must divide by the step's count over all \
             ranks (all-reduce it before backward), not by its own"
        ),
        Numbers::Epoch { epoch } => format!(
            "the runs agree through epoch {} and first differ in epoch {epoch} (step {s}): the shuffle differs \
             between epochs; is set_epoch(epoch) called on every rank's sampler?",
            epoch.saturating_sub(1)
        ),
        Numbers::DifferentSamples => format!(
            "step {s} differs by more than rounding and not by a constant factor: the runs likely see different \
             samples in that step (strided vs contiguous split, padding)"
        ),
        Numbers::ShortWindow { ratio } => format!(
            "accumulation agrees with the big batch until step {s}, the short window at an epoch's end, whose \
             gradient is {ratio:.3}x the big batch's: its loss is divided as if it held K micro-batches; divide by \
             what the window holds (its micro-batches, or its tokens)"
        ),
        Numbers::TokenCount { ratio } => format!(
            "from step {s} accumulation's gradients are {ratio:.4}x the big batch's, one factor per step: the loss \
             is divided by the wrong number of tokens; count the targets (labels != -100, after the causal shift) \
             over every micro-batch of the step and every rank"
        ),
        Numbers::BigBatchFactor { ratio } => format!(
            "from step {s} accumulation's gradients are {ratio:.3}x the big batch's, one factor per step: loss \
             scaling (each micro-batch's loss must be divided by K, by K/W on each rank)"
        ),
        Numbers::PerMicroBatchMean => {
            let users = match w.ours {
                true => "",
                false => {
                    " (Transformers PR 34191: pass num_items_in_batch on to the loss); or the loss couples the \
                     samples of a batch (a contrastive loss's in-batch negatives, BatchNorm's statistics), which one \
                     big batch computes over all of them: then DDP matches accumulation, not a larger batch, unless \
                     the ranks gather their samples"
                }
            };
            format!(
                "step {s} differs from the big batch by more than rounding and not by one factor, though DDP and \
                 accumulation agree: each micro-batch's loss is averaged over its own tokens (or samples) and then \
                 divided by K, so tokens of short micro-batches weigh more; sum the per-token losses and divide by \
                 the step's token count (over all micro-batches and ranks){users}"
            )
        }
        Numbers::HiddenFactor { ratio, steps, norms: (ta, tb), max, whole } => {
            let fix = if *whole { loss_scaling_fix(w) } else { "a uniform factor".to_string() };
            format!(
                "clipping hid a {ratio:.4}x factor: {r}'s total gradient norm before clipping was {ratio:.4}x {l}'s \
                 at every one of the {steps} steps (step 0: {tb:.4} vs {ta:.4}, max_norm {max}); both were clipped \
                 to the same gradients, so the runs agree only while clipping is active and part once the norm \
                 falls under max_norm; {fix}"
            )
        }
        Numbers::NeedlessSync { label, needless, micro_batches, megabytes, times } => {
            let volume = megabytes.map_or("bytes not recorded".into(), |mb| format!("{} per step", size_words(mb)));
            let times: Vec<String> = times.iter().map(|(leg, s)| format!("{leg} {s:.4} s")).collect();
            let timed = match times.is_empty() {
                true => String::new(),
                false => format!("; measured time per step: {}", times.join(", ")),
            };
            format!(
                "{needless} of the {micro_batches} micro-batches per rank were all-reduced needlessly in {label}: \
                 {volume}; wrap all but the last in `no_sync()` (FSDP2: `set_requires_gradient_sync(False)`), which \
                 gives the same gradients with one reduction per step{timed}"
            )
        }
        Numbers::TensorFactor { tensors, ratio, whole } => {
            let r = match (*whole, *ratio < 1.0) {
                (true, true) => format!("1/{:.0} of", 1.0 / ratio),
                (true, false) => format!("{ratio:.0}x"),
                (false, _) => format!("{ratio:.4}x"),
            };
            format!(
                "at step {} {}'s gradients of {} alone are {r} {}'s, and every other tensor agrees: something scales \
                 those gradients by what differs between one process and W ranks (a gradient hook or a per-parameter \
                 multiplier using the micro-batches per process, the rank or the world size); scale them alike in \
                 both runs",
                p.step.unwrap_or(0),
                w.right,
                tensors.join(", "),
                w.left
            )
        }
        Numbers::AmplifiedRounding { ddp, control, margin, scale } => format!(
            "the gradients agree at step 0 and part later, with no recorded fact apart, as this model amplifies \
             rounding: a control run (accumulation again, each step's gradients nudged by {scale:.0e} of each \
             tensor's largest value, about what the reduction's order changed at step 0) parted from accumulation \
             by {} per step and in the final weights, and DDP by {}, within {margin:.0}x the control throughout: \
             counted as rounding. To hold every step to one step's rounding, record fewer steps or train in float64",
            growth_words(control),
            growth_words(ddp)
        ),
        Numbers::ShortBatches { shorts } => format!(
            "the big batch parts from accumulation, which DDP agrees with: the one-process run averaged {shorts} short \
             micro-batch(es) per epoch alone (N off a multiple of W·B), and a short batch's mean weighs each of its \
             samples more than one big batch does. Not counted in the verdict; to make the big batch agree too, \
             make N a multiple of W·B or divide the summed loss by the step's sample count"
        ),
        _ => return None,
    };
    Some(words)
}
