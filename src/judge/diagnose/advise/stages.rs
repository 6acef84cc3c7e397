//! Words for the stages the walk locates from recorded facts: the samples, the loss, the
//! scaling before backward, zeroing, the local gradients and an engine's accumulation.

use super::{loss_division, step};
use crate::evidence::Framework;
use crate::judge::diagnose::owner::Owner;
use crate::judge::diagnose::parting::{Numbers, Parting, Scaled, Side};
use crate::judge::diagnose::source::Words;

pub fn advice(p: &Parting, owner: &Owner, w: &Words) -> Option<String> {
    let (a, b) = (w.left, w.right);
    let label = w.label(p.leg.unwrap_or(Side::Right));
    let s = step(p);
    let upgrade = || format!("the library's, not your script: upgrade {}", owner.name());
    let words = match &p.numbers {
        Numbers::DifferentInputs { missing, differ, total, samples } => {
            let unit = match samples {
                Some(1) => "samples".to_string(),
                Some(n) => format!("samples kept (1 in {n} of a large micro-batch's, by hash)"),
                None => "micro-batches".to_string(),
            };
            let which = match missing {
                Some((rank, nth)) if samples.is_some() => {
                    format!("{b}'s rank {rank} micro-batch {nth} holds samples {a} never saw in that step")
                }
                Some((rank, nth)) => {
                    format!("{b}'s rank {rank} micro-batch {nth} saw inputs no micro-batch of {a} saw")
                }
                None if samples.is_some() => format!("{a} saw samples {b} never saw in that step"),
                None => format!("{a} and {b} saw different numbers of micro-batches"),
            };
            let by = match owner.is_library() {
                true => format!(
                    "{} deals the batches to the ranks; check its drop_last/even_batches settings against the \
                     accumulation run's order",
                    owner.describe()
                ),
                false => "each rank must see the accumulation run's micro-batches of that step (strided vs \
                          contiguous split, padding, the sampler's seed and epoch)"
                    .into(),
            };
            format!(
                "the runs see different samples at step {s} (recorded: {which}; {differ} of {total} {unit} \
                 differ): {by}"
            )
        }
        Numbers::SharedSamples { ranks: (r0, r1), shared, of, every } => {
            let kept = match every {
                1 => String::new(),
                n => format!(" (kept 1 in {n} by hash)"),
            };
            let by = match owner.is_library() {
                true => format!(
                    "{} deals the batches to the ranks; check that its data loader is prepared for the run (its \
                     sharding of the loader)",
                    owner.describe()
                ),
                false => "each rank must read its own share of the data: a DistributedSampler (with set_epoch each \
                          epoch), or a seed that differs by rank where each rank draws its own samples"
                    .into(),
            };
            format!(
                "at step {s} ranks {r0} and {r1} trained on the same samples ({shared} of rank {r0}'s {of} \
                 samples{kept} were also rank {r1}'s): averaging ranks that hold the same data is not one process \
                 accumulating the step's micro-batches; {by}"
            )
        }
        Numbers::NormalisersApart { by_rank } => {
            let each: Vec<String> =
                by_rank.iter().map(|(r, n, w)| format!("rank {r} num_items_in_batch={n}, each item {w:.4e}")).collect();
            let advice = match owner.is_library() {
                true => format!(
                    "{} counts the normaliser on each rank alone; this is the library's, not your script's: upgrade \
                     it, or where it has the setting, count tokens across ranks (Transformers: \
                     TrainingArguments(average_tokens_across_devices=True))",
                    owner.describe()
                ),
                false => PER_RANK_COUNT.into(),
            };
            format!(
                "at step {s} the ranks' micro-batches were normalised by counts of their own and their items weigh \
                 differently in the averaged gradient (recorded: {}), where one process accumulating the step \
                 weighs every item of the window alike; {advice}",
                each.join("; ")
            )
        }
        Numbers::NormalisedPerMicroBatch { rank, counts } => {
            let counts: Vec<String> = counts.iter().map(|n| format!("{n}")).collect();
            let fix = match owner.is_library() {
                true => format!("{}'s, not your script's: upgrade {}", owner.describe(), owner.name()),
                false => "pass every micro-batch the window's count (summed over its micro-batches, and over the \
                          ranks), as Trainer's num_items_in_batch does"
                    .to_string(),
            };
            format!(
                "at step {s} {label}'s rank {rank} divided each micro-batch's loss by a count of its own \
                 (num_items_in_batch {}, which each loss followed: recorded, the factor peeled off each loss times \
                 its count is one number), so the window's items weigh unequally, each 1/(micro-batches · its own \
                 micro-batch's count), where one process dividing the window's sum by the window's count weighs \
                 each alike; {fix}",
                counts.join(", ")
            )
        }
        Numbers::WindowDivided { held, k } => {
            let fix = match owner.is_library() {
                true => format!(
                    "{} counts K, not what the window holds: the library's, not your script's: upgrade {}, or size \
                     the data to a whole number of windows per epoch",
                    owner.describe(),
                    owner.name()
                ),
                false => {
                    "divide each loss by what the window holds (its micro-batches, or its tokens), not by K".to_string()
                }
            };
            format!(
                "at step {s}, the epoch's last window, {label} ran {held} micro-batch(es) per process where a \
                 window holds {k}, and each loss was still divided by {k} (recorded: what backward ran on against \
                 the loss): the short window's gradient is {held}/{k} of the mean the big batch takes; {fix}"
            )
        }
        Numbers::Regrouped { layers } => format!(
            "the runs see the same samples at step {s}, grouped otherwise into micro-batches ({label}'s micro-batches \
             are not {other}'s), and {layers} mix a micro-batch's samples: each micro-batch's batch statistics \
             differ. Deal each rank the accumulation run's micro-batches whole (AccumulationBatchSampler, or a \
             DistributedSampler over contiguous blocks), or use SyncBatchNorm/GroupNorm where the grouping \
             should not count",
            other = w.label(p.leg.unwrap_or(Side::Right).other()),
        ),
        Numbers::NormaliserPerRank { losses: (lx, ly), normalisers: (nx, ny), rank } => {
            let advice = match owner.is_library() {
                true => format!(
                    "{} counts the normaliser on each rank alone; this is the library's, not your script's: \
                     upgrade it, or where it has the setting, count tokens across ranks \
                     (Transformers: TrainingArguments(average_tokens_across_devices=True))",
                    owner.describe()
                ),
                false => PER_RANK_COUNT.into(),
            };
            format!(
                "the same inputs gave different losses at step {s}: {a} {lx:.6} with num_items_in_batch={nx} \
                 against {b}'s rank {rank} {ly:.6} with num_items_in_batch={ny}: each micro-batch's loss is divided \
                 by a different token count; {advice}"
            )
        }
        Numbers::LossDiffers { losses: (lx, ly), rank } => {
            let said = match rank {
                Some(rank) => format!(
                    "the same inputs gave different losses at step {s} ({a} {lx:.6}, {b}'s rank {rank} {ly:.6})"
                ),
                None => format!(
                    "the same samples, grouped otherwise into micro-batches of one size, gave a different mean loss at \
                     step {s} ({a} {lx:.9}, {b} {ly:.9}, beyond the rounding of its loss dtype)"
                ),
            };
            format!(
                "{said} from the same weights: the forward differs between the runs (a rank's own model state or \
                 loss settings such as label smoothing, dropout, or a loss computed from other than the inputs)"
            )
        }
        Numbers::PrecisionApart { what, left, right } => {
            let advice = match owner.is_library() {
                true => format!("{} set it: give both runs the same precision flag", owner.describe()),
                false => "give both runs the same precision (the same autocast and model dtype): a run computed \
                          in another precision is another training"
                    .into(),
            };
            let said = |(d, how): &(crate::spec::Dtype, &str)| format!("{} ({how})", d.name());
            let (left, right) = (said(left), said(right));
            format!("the runs trained at other precisions: {what} {left} in {a}, {right} in {b}; {advice}")
        }
        Numbers::RanksPrecision { rank, digits, first: (r0, d0) } => {
            let said = |d: u32| match crate::spec::Dtype::of_digits(d) {
                _ if d == 0 => "autocast off".to_string(),
                Some(t) => format!("{} autocast", t.name()),
                None => format!("autocast of {d} significand digits"),
            };
            let advice = match owner.is_library() {
                true => format!("{} set it: give every rank the same precision flag", owner.describe()),
                false => "enter the same autocast on every rank (a condition on the rank, or a flag only some \
                          ranks read, trains each at its own precision)"
                    .into(),
            };
            format!(
                "at step {s} {label}'s ranks ran their forwards at other precisions: rank {r0} under {}, rank {rank} \
                 under {} (recorded at each micro-batch's forward); {advice}",
                said(*d0),
                said(*digits)
            )
        }
        Numbers::ZeroedInWindow { times } => {
            let advice = match owner.is_library() {
                true => format!(
                    "{} zeroed them, not your script (which leaves the window to it): upgrade {}",
                    owner.describe(),
                    owner.name()
                ),
                false => "your loop zeroes them: call zero_grad() only after optimizer.step(), once per K \
                          micro-batches"
                    .into(),
            };
            format!(
                "at step {s} {label}'s gradients were zeroed {times} time(s) after a backward and before the optimizer \
                 step (recorded): the micro-batches before each zeroing never reach the step; {advice}"
            )
        }
        Numbers::ScaledInBackward { ratio } => format!(
            "at step {s} the gradients came out of backward {ratio:.4}x apart in {b} against {a}, beyond what the \
             values backward ran on explain (recorded: each parameter's local gradient sum, against the matched \
             micro-batches' roots): {} scaled the gradients inside the backward it ran, differently in each run; {}",
            owner.describe(),
            upgrade()
        ),
        Numbers::Scaling { ratio, scales: (sa, sb), how, .. } => {
            let direction = match *ratio > 1.0 {
                true => format!("{b}'s gradients are {ratio:.2}x {a}'s"),
                false => format!("{b}'s gradients are {:.2}x smaller than {a}'s", 1.0 / ratio),
            };
            format!(
                "{direction} from step {s}: the same losses were scaled differently before backward (recorded: {a} \
                 multiplied each loss by {sa:.4}, {b} by {sb:.4}); {}",
                scaled(how, label, owner)
            )
        }
        Numbers::MovedInWindow { losses: (lx, ly), rank } => format!(
            "at step {s}, which both runs start from the same weights, each process's first micro-batch gave the \
             same loss in both, and a later one did not (the same inputs: {lx:.6} in {a}, {ly:.6} on {b}'s rank \
             {rank}): the weights moved inside the accumulation window. Something the script does after each \
             micro-batch's backward changes them (weight decay or a clamp applied by hand, an EMA or a scheduler \
             writing into the model, an optimizer stepped per micro-batch), K times a step in one process and K/W \
             on each rank; do it once per optimizer step, after optimizer.step()"
        ),
        Numbers::ScaledPerRank { scales, one } => {
            let each: Vec<String> = scales.iter().map(|(r, f)| format!("rank {r} by {f:.4e}")).collect();
            let by = match owner.is_library() {
                true => format!(
                    "{} counts the normaliser on each rank alone: upgrade it, or count across ranks",
                    owner.describe()
                ),
                false => "your script divides each rank's loss by a count of that rank's own micro-batches: \
                          all-reduce the count over the ranks and multiply the loss by W before backward (DDP \
                          averages), or use a per-sample mean"
                    .into(),
            };
            format!(
                "at step {s} every micro-batch's loss was scaled by {one:.4e} in the one process, but {label}'s ranks \
                 scaled theirs each by a factor of its own ({}): the ranks' average of such means is not the \
                 step's mean; {by}",
                each.join(", ")
            )
        }
        Numbers::LocalDiffers { param, sums: (x, y) } => format!(
            "the same losses, scaled alike, gave other gradients before any reduction at step {s} (recorded: \
             {param}'s local gradient sum, unscaled, {x:.6e} in {a} against {y:.6e} over {b}'s ranks): the backward \
             differs between the runs (a parameter frozen or hooked in one run, a gradient changed before the step, \
             a rank's own model)"
        ),
        Numbers::Lost { marked_by } => {
            // Boundaries marked by hand (set_gradient_accumulation_boundary): several
            // backwards per engine step are the engine's documented use.
            let marked = marked_by.map_or(String::new(), |by| {
                format!(
                    " between the accumulation boundaries {} marked by hand (set_gradient_accumulation_boundary, \
                     the engine's documented way to run several backwards per step)",
                    if by == Framework::Plain { "your script" } else { by.name() }
                )
            });
            format!(
                "from step {s} the gradient {label}'s optimizer applied is no multiple of the local gradients its \
                 backward passes made (recorded: each parameter's local gradient sum before the engine took it, \
                 against the applied gradient's): {} lost or changed micro-batches while accumulating them{marked}; \
                 {}",
                owner.describe(),
                upgrade()
            )
        }
        _ => return None,
    };
    Some(words)
}

/// Until an upgrade: how to make a framework that hands the loss to backward divide it.
/// The script has each rank count its own normaliser (by hand, or by a framework's setting).
const PER_RANK_COUNT: &str = "your script has each rank count its own normaliser: count it across the ranks \
     (all-reduce the count and multiply the loss by W before backward, as DDP averages; Transformers: \
     TrainingArguments(average_tokens_across_devices=True))";

fn never_divided_workaround(f: Framework) -> &'static str {
    match f {
        // Trainer skips its division for a model whose forward takes loss kwargs (**kwargs),
        // leaving it to num_items_in_batch: its documented switch.
        Framework::Transformers => {
            ", or set trainer.model_accepts_loss_kwargs = False so that Trainer divides (or use num_items_in_batch)"
        }
        _ => "",
    }
}

/// Which way the loss was scaled wrong and who must change: a division on top of a
/// framework's, by K on every rank, or a loss never divided take opposite advice.
fn scaled(how: &Scaled, label: &str, owner: &Owner) -> String {
    let backward = |api: Framework| loss_division(api).unwrap_or("the framework's backward");
    match how {
        Scaled::NormalisedTwice { by_api, api } => match owner.is_library() {
            true => format!(
                "{} normalised each loss over the window (num_items_in_batch) and handed it to {}, which divided it \
                 by {by_api:.4} again; the library's, not your script: upgrade {}",
                owner.describe(),
                backward(*api),
                owner.name()
            ),
            false => format!(
                "your script hands a loss already normalised over the window (num_items_in_batch) to {}, which \
                 divides it by {by_api:.4} again: tell the backward not to divide (scale_wrt_gas=False) or hand it \
                 the per-micro-batch mean",
                backward(*api)
            ),
        },
        // Who divided before the API is not recorded (a framework's loop may run the
        // script's override): the script's, as its code returns the loss.
        Scaled::Twice { pre, by_api, api } => format!(
            "the loss was divided twice, by {pre:.4} before the backward API and by {by_api:.4} inside it: {} already \
             divides each loss by the accumulation steps, so a loss divided by K in your own step is divided twice: \
             return the plain mean loss",
            backward(*api)
        ),
        Scaled::ToldAll { n, k, api } => format!(
            "{} divided each loss by the {n} micro-batches it was told to accumulate, but each process runs {k} per \
             step: tell it the micro-batches per process (K/W under DDP, K alone)",
            api.describe()
        ),
        Scaled::ByApi { by_api, k, .. } => format!(
            "{} scaled each loss by {by_api:.4} where 1/{k} averages the micro-batches each process runs: the \
             library's scaling, not your script: upgrade {}",
            owner.describe(),
            owner.name()
        ),
        Scaled::Own { sc, k, dev, handed } => match (*dev < 1.0, loss_division(*handed)) {
            (true, Some(how)) => format!(
                "{label} scales each loss by {sc:.4}: {how} already divides each loss by the accumulation steps, so \
                 a loss divided by K in your own step is divided twice: return the plain mean loss"
            ),
            (true, None) => format!(
                "{label} divides each loss by {:.2} where the {k} micro-batches each of its processes runs need {k}: \
                 divide by the micro-batches per process (K in accumulation, K/W on each rank), not by K on every \
                 rank",
                1.0 / sc
            ),
            (false, _) if owner.is_library() => format!(
                "{label} scales each loss by {sc:.4}, {dev:.2}x what its {k} micro-batches per process need: {} handed \
                 each micro-batch's loss to backward never divided by the accumulation steps (K times too large in \
                 one process, K/W on each rank); the library's, not your script, which returns the mean loss: upgrade {}{}",
                owner.describe(),
                owner.name(),
                never_divided_workaround(*handed)
            ),
            (false, _) => format!(
                "{label} scales each loss by {sc:.4}, {dev:.2}x what its {k} micro-batches per process need: divide \
                 each micro-batch's loss by the micro-batches each process runs (K in accumulation, K/W on each rank)"
            ),
        },
    }
}
