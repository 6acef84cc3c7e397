//! Synchronisation: which processes ran, and whether DDP's ranks held one model and one
//! gradient (facts the recorder and our ranks' fingerprints record).

use super::{Diagnosis, Evidence};
use crate::evidence::{DdpForward, Leg, Trace};
use crate::judge::Reason;

/// A trace meant as DDP's (its `leg` header, or its name) written by a world of 1, beside
/// another one-process trace: the "DDP" leg never started its W processes.
pub fn one_process(ev: &Evidence) -> Option<Diagnosis> {
    let one = |t: &Trace| t.header.world_size == Some(1);
    if !one(ev.a) || !one(ev.b) {
        return None;
    }
    let meant = |label: &str, t: &Trace| t.header.leg.map_or(label.contains("ddp"), |leg| leg == Leg::Ddp);
    let (label, _) = [(ev.left(), ev.a), (ev.right(), ev.b)].into_iter().find(|(l, t)| meant(l, t))?;
    Diagnosis::new(
        Reason::OneProcess,
        format!(
            "{label} was written by a world of 1: the DDP leg ran as one process, without its ranks \
             (`accelerate launch --cpu` starts one process unless given --multi_gpu --num_processes W; \
             torchrun needs --nproc_per_node W); launch it with W processes and record again"
        ),
    )
}

/// A DDP rank's gradient that differs from rank 0's, traced to the micro-batches whose
/// backward ran without DDP's all-reduce where the recorder saw DDP's forwards: an
/// all-reduce covers everything accumulated before it, so the micro-batches after the last
/// synchronised one stay local to each rank.
pub fn unsynced(ev: &Evidence) -> Option<Diagnosis> {
    let d = ev.c.rank_drift.as_ref()?;
    let param = d.unsynced_grad()?;
    let (step, rank) = (d.step, d.rank);
    let head = format!("at step {step} DDP rank {rank}'s gradient of {param} differs from rank 0's");
    let t = if ev.a.facts.rank_drift.is_some() { ev.a } else { ev.b };
    let flags = t.facts.ddp_sync.get(step).filter(|f| !f.is_empty());
    let detail = match flags {
        Some(f) => synced_micro_batches(&head, f),
        None if t.header.ddp_forward == Some(DdpForward::None) => format!(
            "{head}: no DistributedDataParallel forward ran (the model is not wrapped in DDP, or is called \
             through its .module), so nothing all-reduced the gradients; wrap the model and call the wrapper"
        ),
        None => format!(
            "{head}: DDP all-reduces a synchronised backward into the same gradient on every rank, so part of \
             this one was never all-reduced; a micro-batch that should sync ran without it \
             (require_backward_grad_sync set after the forward, no_sync around the last micro-batch) and each rank \
             steps with its own mix of synced and local gradients"
        ),
    };
    Diagnosis::new(Reason::UnsyncedGradient, detail)
}

/// What the per-forward sync flags of the step say: which micro-batches stayed local.
fn synced_micro_batches(head: &str, f: &[bool]) -> String {
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
             scaling that runs on some ranks only)"
        );
    }
    let which = if local == 1 { format!("micro-batch {m}") } else { format!("micro-batches {}-{m}", m - local + 1) };
    format!(
        "{head}: {which} of this rank's {m} ran the backward without DDP's all-reduce \
         (require_backward_grad_sync was False when its forward ended, which is when DDP decides: \
         set it before calling the model, or run all but the last micro-batch under model.no_sync()), \
         so each rank stepped with the synchronised sum of the earlier micro-batches plus its own local \
         gradient of the rest"
    )
}

/// A sharded engine's step whose last micro-batch did not reduce its gradients: FSDP2 keeps
/// an unreduced gradient in its own buffers (the optimizer gets none of it) and adds it into
/// the next reduction, so nothing differs between ranks for `unsynced` to see; the recorded
/// flags say which micro-batches.
pub fn unreduced_tail(ev: &Evidence) -> Option<Diagnosis> {
    [(ev.left(), ev.a), (ev.right(), ev.b)].into_iter().find_map(|(label, t)| {
        let engine = t.header.engine.filter(|e| e.is_sharded())?;
        let s = t.facts.ddp_sync.iter().position(|f| f.last() == Some(&false))?;
        let f = &t.facts.ddp_sync[s];
        let m = f.len();
        let tail = f.iter().rev().take_while(|synced| !**synced).count();
        let off = engine.no_sync();
        let detail = if tail == m {
            let moved = match t.steps.get(s).is_none_or(|g| g.is_empty()) {
                true => "so the optimizer got no gradient at all and the weights did not move",
                false => "so each rank stepped with whatever gradient it kept unreduced",
            };
            format!(
                "at step {s} none of {label}'s {m} micro-batches per rank reduced its gradients ({off} was on through \
                 the last backward, and never set back), {moved}"
            )
        } else {
            let which =
                if tail == 1 { format!("micro-batch {m}") } else { format!("micro-batches {}-{m}", m - tail + 1) };
            format!(
                "at step {s} {which} of {label}'s {m} per rank did not reduce its gradients ({off} on its backward) \
                 although an earlier one did: the engine keeps an unreduced gradient aside and adds it into the next \
                 reduction, so this step applied only the micro-batches up to the last reduction and the next step \
                 carries the rest"
            )
        };
        Diagnosis::new(
            Reason::UnsyncedGradient,
            format!(
                "{detail}; reduce on the last micro-batch's backward of every step, and only there \
                 (set_requires_gradient_sync(micro == last))"
            ),
        )
    })
}

/// A sharded engine that divided the reduced gradients by something else than the world
/// size (FSDP2's set_gradient_divide_factor; pytorch#162338 summed on gloo): a fact the
/// recorder read from the engine, said with the factor it makes.
pub fn summed_over_ranks(ev: &Evidence) -> Option<Diagnosis> {
    [(ev.left(), ev.a), (ev.right(), ev.b)].into_iter().find_map(|(label, t)| {
        let (w, f) = (t.header.world_size? as f64, t.header.grad_divide?);
        if f <= 0.0 || (f - w).abs() <= 1e-9 * w {
            return None;
        }
        let r = w / f;
        let how = if f == 1.0 { "summed over ranks, not averaged" } else { "divided by the wrong count" };
        Diagnosis::new(
            Reason::SummedOverRanks,
            format!(
                "{label}'s gradients are {r}x: {how}; its engine divided the reduced gradients by {f} where averaging \
                 over W={w} ranks divides by {w} (set_gradient_divide_factor({f:?}); pytorch#162338 summed this way on \
                 gloo): remove the divide factor, or set it to the world size"
            ),
        )
    })
}

/// A DDP rank that held another model than rank 0 (weights or optimizer state).
pub fn ranks_differ(ev: &Evidence) -> Option<Diagnosis> {
    let d = ev.c.rank_drift.as_ref()?;
    Diagnosis::new(
        Reason::RanksDiffer,
        format!(
            "after step {} DDP rank {} held another {} than rank 0: the ranks no longer train one model; a \
             parameter left out of the all-reduce (a hand-written all-reduce that skips one, a parameter \
             registered after DDP wrapped the model) steps with each rank's own gradient",
            d.step, d.rank, d.tensor
        ),
    )
}
