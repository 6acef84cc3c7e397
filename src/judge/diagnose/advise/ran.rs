//! Words for what ran and how the ranks synchronised: processes, the deal, steps and their
//! cadence, micro-batches left unreduced, a rank apart, a reduction that does not average.

use super::step;
use crate::judge::diagnose::measure::{near, FACTOR_REL};
use crate::judge::diagnose::owner::Owner;
use crate::judge::diagnose::parting::{Deal, Numbers, Parting, Side, Steps, Synced};
use crate::judge::diagnose::source::Words;

pub fn advice(p: &Parting, owner: &Owner, w: &Words) -> Option<String> {
    let label = w.label(p.leg.unwrap_or(Side::Right));
    let s = step(p);
    let words = match &p.numbers {
        Numbers::OneProcess => format!(
            "{label} was written by a world of 1: the DDP leg ran as one process, without its ranks \
             (`accelerate launch --cpu` starts one process unless given --multi_gpu --num_processes W; \
             torchrun needs --nproc_per_node W); launch it with W processes and record again"
        ),
        Numbers::DealtUnevenly(deal) => dealt(deal, p.leg, owner, w),
        &Numbers::EpochCutShort { steps, loader, accumulation, epochs, left } => {
            let fix = match owner.is_library() {
                true => format!(
                    "{} counts whole windows only: the library's, not your script's: upgrade {}, or size the data to \
                     a whole number of windows per epoch",
                    owner.describe(),
                    owner.name()
                ),
                false => "plan a step for each epoch's partial last window too (round the windows up)".to_string(),
            };
            format!(
                "{label} planned {steps} optimizer step(s) for {epochs} epoch(s) of {loader} batches at {accumulation} \
                 per step (recorded: the plan its framework made from the loader), {} short of a step for each \
                 window: each epoch's last {left} batch(es), a partial window, never reach an optimizer step, which \
                 a run without accumulation takes; {fix}",
                loader.div_ceil(accumulation).saturating_mul(epochs).saturating_sub(steps)
            )
        }
        &Numbers::UnreducedTail { engine, micro_batches: m, tail, moved } => {
            let off = engine.no_sync();
            let detail = if tail == m {
                let moved = match moved {
                    false => "so the optimizer got no gradient at all and the weights did not move",
                    true => "so each rank stepped with whatever gradient it kept unreduced",
                };
                format!(
                    "at step {s} none of {label}'s {m} micro-batches per rank reduced its gradients ({off} was on \
                     through the last backward, and never set back), {moved}"
                )
            } else {
                format!(
                    "at step {s} {} of {label}'s {m} per rank did not reduce its gradients ({off} on its backward) \
                     although an earlier one did: the engine keeps an unreduced gradient aside and adds it into the \
                     next reduction, so this step applied only the micro-batches up to the last reduction and the \
                     next step carries the rest",
                    which(m, tail)
                )
            };
            format!(
                "{detail}; reduce on the last micro-batch's backward of every step, and only there \
                 (set_requires_gradient_sync(micro == last))"
            )
        }
        Numbers::SteppedEarly { micro, told, calls } => format!(
            "{label}'s optimizer stepped after every {micro} backward pass(es), though {} was told to accumulate \
             {told} micro-batches per step: the script called the wrapper's step() {calls} time(s) per optimizer \
             step and the wrapper let each one through. The library's step gating is at fault, not your loop \
             (calling step() every micro-batch under its accumulation is its documented use): upgrade {}",
            owner.describe(),
            owner.name()
        ),
        Numbers::StepCount(steps) => step_count(steps, w),
        Numbers::OtherStart => format!(
            "{} and {} started from other weights: the trained weights as each run's first forward found \
             them differ (recorded checksums), so nothing after can agree. One resumed from a checkpoint (another \
             leg's, or an earlier run's left in the working folder), or the model was initialised from another seed \
             or state; start both from the same weights (no resume, one seed before the model is built)",
            w.left, w.right
        ),
        &Numbers::EngineBoundary { per_step, gas } => {
            let every = match gas {
                1 => "every backward".to_string(),
                n => format!("every {n}th backward"),
            };
            format!(
                "{label} ran {per_step} backward passes per optimizer step per rank under DeepSpeed's \
                 gradient_accumulation_steps={gas}: engine.backward takes {every} for an accumulation boundary, \
                 where it reduces and restarts the gradients, so the earlier micro-batches of each step are lost \
                 (stage 3 keeps them, undivided); set gradient_accumulation_steps to the micro-batches per step and \
                 call engine.step() after every engine.backward (it steps only at the boundary)"
            )
        }
        Numbers::Unsynced { rank, param, synced } => {
            let head = format!("at step {s} DDP rank {rank}'s gradient of {param} differs from rank 0's");
            match owner {
                Owner::Library { api, .. } if api.starts_with("the DistributedDataParallel it built") => format!(
                    "{}. The DistributedDataParallel module was built and is driven by {}: the reduction that did \
                     not make the ranks agree is the library's, not your script: upgrade {}, or build the module \
                     without the setting named",
                    unsynced(&head, synced).trim_end_matches('.'),
                    owner.describe(),
                    owner.name()
                ),
                _ => engine_reduces(unsynced(&head, synced), owner),
            }
        }
        Numbers::RanksDiffer { rank, tensor } => engine_reduces(
            format!(
                "after step {s} DDP rank {rank} held another {tensor} than rank 0: the ranks no longer train one \
                 model. Either a parameter left out of the all-reduce (a hand-written all-reduce that skips one, a \
                 parameter registered after DDP wrapped the model) steps with each rank's own gradient, or the \
                 ranks update alike gradients differently (an optimizer built with other settings on some rank, a \
                 weight changed by hand on one rank)"
            ),
            owner,
        ),
        &Numbers::Reduction { divide, world, .. } => reduction(divide, world, s, label, owner),
        _ => return None,
    };
    Some(words)
}

/// "micro-batch 4" or "micro-batches 3-4": the last `tail` of `m`.
fn which(m: usize, tail: usize) -> String {
    match tail {
        1 => format!("micro-batch {m}"),
        _ => format!("micro-batches {}-{m}", m - tail + 1),
    }
}

/// Ranks that part under an engine's own reduction: its library's, which the script cannot
/// skip.
fn engine_reduces(detail: String, owner: &Owner) -> String {
    match owner.is_library() {
        true => format!(
            "{}. Here the ranks are synchronised by {} alone, inside its own backward and step, which the script \
             cannot skip: the library's reduction, not your script: upgrade {}",
            detail.trim_end_matches('.'),
            owner.describe(),
            owner.name()
        ),
        false => detail,
    }
}

/// What the per-forward sync flags of the step say: which micro-batches stayed local.
fn unsynced(head: &str, synced: &Synced) -> String {
    let f = match synced {
        Synced::Flags(f) => f,
        Synced::NoDdpForward => {
            return format!(
                "{head}: no DistributedDataParallel forward ran (the model is not wrapped in DDP, or is called \
                 through its .module), so nothing all-reduced the gradients; wrap the model and call the wrapper"
            )
        }
        Synced::Unknown => {
            return format!(
                "{head}: DDP all-reduces a synchronised backward into the same gradient on every rank, so part of \
                 this one was never all-reduced; a micro-batch that should sync ran without it \
                 (require_backward_grad_sync set after the forward, no_sync around the last micro-batch) and each \
                 rank steps with its own mix of synced and local gradients"
            )
        }
    };
    let local = f.iter().rev().take_while(|&&synced| !synced).count();
    let m = f.len();
    if local == m {
        return format!(
            "{head}: none of this rank's {m} micro-batches was all-reduced (require_backward_grad_sync was \
             False, or no_sync() was on, when each forward ended, which is when DDP decides), so each rank \
             stepped with its own gradient; let the last micro-batch's forward run with it True"
        );
    }
    if local == 0 {
        return format!(
            "{head} although DDP all-reduced this step's last micro-batch (and with it every earlier one): \
             something changed the gradient on one rank after the all-reduce (a gradient hook, a clip or a \
             scaling that runs on some ranks only), or the all-reduce DDP was asked for did not run"
        );
    }
    format!(
        "{head}: {} of this rank's {m} ran the backward without DDP's all-reduce \
         (require_backward_grad_sync was False when its forward ended, which is when DDP decides: \
         set it before calling the model, or run all but the last micro-batch under model.no_sync()), \
         so each rank stepped with the synchronised sum of the earlier micro-batches plus its own local \
         gradient of the rest",
        which(m, local)
    )
}

/// A reduction that divided by `d` where averaging divides by `world`: the script's setting
/// of the engine's divide factor, or the library's own reduction.
fn reduction(d: f64, world: usize, s: usize, label: &str, owner: &Owner) -> String {
    let w = world as f64;
    if !owner.is_library() {
        let how = if d == 1.0 { "summed over ranks, not averaged" } else { "divided by the wrong count" };
        return format!(
            "{label}'s gradients are {}x: {how}; its engine divided the reduced gradients by {d} where averaging \
             over W={world} ranks divides by {world} (set_gradient_divide_factor({d:?}); pytorch#162338 summed \
             this way on gloo): remove the divide factor, or set it to the world size",
            w / d
        );
    }
    let what = match d < w {
        true => format!(
            "{}: the applied gradients are {:.2}x too large",
            match near(d, 1.0, FACTOR_REL) {
                true => "summed them instead of averaging",
                false => "divided them by less than the ranks",
            },
            w / d
        ),
        false => format!(
            "divided them by {:.2} more than averaging does: the applied gradients are {:.2}x too small",
            d / w,
            d / w
        ),
    };
    format!(
        "at step {s} {label}'s reduction divided the {world} ranks' local gradients by {d:.2} where averaging divides \
         by {world} (recorded: each parameter's local gradient before the reduction, summed over ranks, against the \
         gradient the optimizer applied); {} {what}. The divide is measured around the reduction itself, whatever \
         scaled the loss before backward, so this is the library's reduction, not your script: upgrade {} (or average yourself only where its docs \
         say so)",
        owner.describe(),
        owner.name()
    )
}

fn step_count(steps: &Steps, w: &Words) -> String {
    let (l, r) = (w.left, w.right);
    match *steps {
        Steps::EveryMicroBatch { one, n, other, m, k } => format!(
            "{} steps the optimizer after every micro-batch ({n} steps, 1 backward each) where {} steps after {k} \
             ({m} steps): one run does not accumulate; call optimizer.step() and zero_grad() once per K \
             micro-batches (K/W per rank under DDP)",
            w.label(one),
            w.label(other)
        ),
        Steps::Neither { k, left, right } => format!(
            "{l} made {left} optimizer steps and {r} made {right}, each after a single backward though K={k}: \
             neither run accumulates; call optimizer.step() and zero_grad() once per K micro-batches (K/W per rank \
             under DDP)"
        ),
        Steps::Cadences { left: (ls, x), right: (rs, y) } => format!(
            "{l} made {ls} optimizer steps of {x} backward passes each and {r} made {rs} of {y}: the runs step at \
             different cadences; the accumulation condition must step once per K micro-batches in total \
             ((i + 1) % K == 0, K/W per rank), not e.g. i % (K - 1) == 0"
        ),
        Steps::Counts { left, right } => format!(
            "{l} made {left} optimizer steps and {r} made {right}: the samplers give different numbers of \
             micro-batches"
        ),
    }
}

/// Where the legs' deals differ, in words, with the fix; a framework that deals the batches
/// (Accelerate's even_batches pads them) said as its documented behaviour, fixed by its
/// settings.
fn dealt(deal: &Deal, leg: Option<Side>, owner: &Owner, w: &Words) -> String {
    let (who, other) = match leg {
        Some(side) => (w.label(side), w.label(side.other())),
        None => (w.right, w.left),
    };
    let of = |d: &Option<usize>| d.map_or(String::new(), |d| format!(" of N={d}"));
    let per_rank = "deal the one-process run as W ranks of DistributedSampler would \
                    (ddp_verify_trace.AccumulationBatchSampler)";
    match deal {
        Deal::Padded { samples, dataset, .. } if owner.is_library() => format!(
            "{who}'s batches, dealt by {}, padded the data set{} with {samples} sample(s) repeated from the epoch's \
             start so that every rank's last batch is full (Accelerate's even_batches, its default): {who} trains \
             on them twice each epoch, {other} once. Keep N a multiple of W·B; dataloader_drop_last=True \
             (Trainer) or even_batches=False (Accelerator) stops the repeating but leaves out a last round that \
             one process still trains on",
            owner.describe(),
            of(dataset)
        ),
        Deal::Padded { samples, dataset, repeated, world } => format!(
            "{who}'s sampler padded the data set{} with {samples} repeated sample(s){} so that its {world} shards \
             are equal (DistributedSampler's default drop_last=False): {who} trains on them twice each epoch, \
             {other} once. Keep N a multiple of W, {per_rank}, or pass drop_last=True and leave as many out of both \
             runs",
            of(dataset),
            repeated.as_deref().map_or(String::new(), |r| format!(" (data set indices {r})"))
        ),
        Deal::SamplerDropped { samples, dataset, world } => format!(
            "{who}'s DistributedSampler(drop_last=True) left out {samples} sample(s){} each epoch so that its \
             {world} shards are equal; {other} trains on them. Keep N a multiple of W, or {per_rank} with \
             drop_last=True",
            of(dataset)
        ),
        Deal::LoaderDropped { left, right } => format!(
            "the data loaders' drop_last left out {left} sample(s) per epoch in {} and {right} in {}: each rank \
             drops the short last batch of its own shard, one process only that of the whole data set. Make N a \
             multiple of W·B, or {per_rank}",
            w.left, w.right
        ),
        Deal::ShortBatches { left, right } => format!(
            "{} ends each epoch with {left} micro-batch(es) shorter than the batch size and {} with {right}: each \
             rank's shard leaves a short last batch of its own, and a short batch's mean weighs each of its \
             samples more than a full one's. Make N a multiple of W·B, {per_rank}, or pass drop_last=True to \
             both loaders alike",
            w.left, w.right
        ),
    }
}
