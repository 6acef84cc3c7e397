//! Synchronisation: which processes ran, and whether DDP's ranks held one model and one
//! gradient (facts the recorder and our ranks' fingerprints record).

use super::{Diagnosis, Evidence};
use crate::evidence::{Leg, Trace};
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
        None if t.header.ddp_forward_seen == Some(false) => format!(
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
