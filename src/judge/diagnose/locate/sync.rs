//! Synchronisation: which processes ran, and whether DDP's ranks held one model and one
//! gradient (facts the recorder and our ranks' fingerprints record).

use crate::evidence::{DdpForward, Leg, Trace};
use crate::judge::diagnose::measure::legs::engine_accumulates;
use crate::judge::diagnose::parting::{Numbers, Parting, Side, Synced};
use crate::judge::diagnose::{Evidence, Source as _, Stage};

/// A trace meant as DDP's (its `leg` header, or its name) written by a world of 1, beside
/// another one-process trace: the "DDP" leg never started its W processes.
pub fn one_process(ev: &Evidence) -> Option<Parting> {
    let one = |t: &Trace| t.header.world_size == Some(1);
    if !one(ev.a) || !one(ev.b) {
        return None;
    }
    let meant = |label: &str, t: &Trace| t.header.leg.map_or(label.contains("ddp"), |leg| leg == Leg::Ddp);
    let side = ev.sides().into_iter().find(|&(side, t)| meant(ev.words().label(side), t))?.0;
    Some(Parting::new(None, Some(Stage::Reduction), Some(side), Numbers::OneProcess))
}

/// A DDP rank that held another gradient or model than rank 0. A gradient: traced to the
/// micro-batches whose backward ran without DDP's all-reduce, where the recorder saw DDP's
/// forwards (an all-reduce covers everything accumulated before it, so the micro-batches
/// after the last synchronised one stay local to each rank). Otherwise weights or optimizer
/// state: a parameter left out of the all-reduce. Under an engine that reduces inside its
/// own backward and step, the ranks part at that reduction.
pub fn rank_drift(ev: &Evidence) -> Option<Parting> {
    let d = ev.c.rank_drift.as_ref()?;
    let (side, t) = if ev.a.facts.rank_drift.is_some() { (Side::Left, ev.a) } else { (Side::Right, ev.b) };
    let engine = [ev.b, ev.a].into_iter().any(|t| engine_accumulates(t) && t.header.world_size.unwrap_or(1) > 1);
    let Some(param) = d.unsynced_grad() else {
        // The ranks' gradients agreed (a gradient apart sorts first): their updates parted.
        let stage = if engine { Stage::Reduction } else { Stage::Update };
        let numbers = Numbers::RanksDiffer { rank: d.rank, tensor: d.tensor.clone() };
        return Some(Parting::new(Some(d.step), Some(stage), Some(side), numbers));
    };
    let synced = match t.facts.ddp_sync.get(d.step).filter(|f| !f.is_empty()) {
        Some(f) => Synced::Flags(f.clone()),
        None if t.header.ddp_forward == Some(DdpForward::None) => Synced::NoDdpForward,
        None => Synced::Unknown,
    };
    let numbers = Numbers::Unsynced { rank: d.rank, param: param.to_string(), synced };
    Some(Parting::new(Some(d.step), Some(Stage::Reduction), Some(side), numbers))
}

/// A sharded engine's step whose last micro-batch did not reduce its gradients: FSDP2 keeps
/// an unreduced gradient in its own buffers (the optimizer gets none of it) and adds it into
/// the next reduction, so nothing differs between ranks for `rank_drift` to see; the
/// recorded flags say which micro-batches.
pub fn unreduced_tail(ev: &Evidence) -> Option<Parting> {
    ev.sides().into_iter().find_map(|(side, t)| {
        let engine = t.header.engine.filter(|e| e.is_sharded())?;
        let s = t.facts.ddp_sync.iter().position(|f| f.last() == Some(&false))?;
        let f = &t.facts.ddp_sync[s];
        let tail = f.iter().rev().take_while(|synced| !**synced).count();
        let moved = !t.steps.get(s).is_none_or(|g| g.is_empty());
        let numbers = Numbers::UnreducedTail { engine, micro_batches: f.len(), tail, moved };
        Some(Parting::new(Some(s), Some(Stage::Reduction), Some(side), numbers))
    })
}

/// A sharded engine configured to divide the reduced gradients by something else than the
/// world size (FSDP2's set_gradient_divide_factor): a fact the recorder read from the
/// engine. The walk measures the same mechanism where the engine itself does it.
pub fn configured_divide(ev: &Evidence) -> Option<Parting> {
    ev.sides().into_iter().find_map(|(side, t)| {
        let (w, f) = (t.header.world_size?, t.header.grad_divide?);
        if f <= 0.0 || (f - w as f64).abs() <= 1e-9 * w as f64 {
            return None;
        }
        let numbers = Numbers::Reduction { divide: f, world: w, configured: true };
        Some(Parting::new(None, Some(Stage::Reduction), Some(side), numbers))
    })
}
