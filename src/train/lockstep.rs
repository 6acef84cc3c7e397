//! Lockstep: deep BatchNorm networks are numerically chaotic in float32 (rounding
//! differences grow about a million-fold per step), so two free-running runs drift apart
//! although they are mathematically equivalent. Here, before every optimizer step, every DDP
//! rank restarts from the accumulation run's weights and BatchNorm buffers, so a step's
//! difference measures that step's arithmetic alone. Each run keeps its own optimizer state:
//! momentum is linear in the gradients, so it carries per-step differences without
//! amplifying them, and nothing it holds feeds a forward pass.

use std::sync::mpsc::{sync_channel, Receiver, SyncSender};

use crate::dist::Collective;
use crate::error::Result;
use crate::evidence::{Params, Trace};
use crate::spec::TrainConfig;

use super::{accumulation_run, big_batch_run, ddp_run, DdpStart, Run, State};
use crate::dist::world as launch;

/// Receives step `s`'s gradients from the accumulation run and from DDP as soon as both
/// exist, so they can be compared and dropped (memory stays flat in the number of steps),
/// with what rounding allows them to differ by (`Bounds`).
pub type StepSink<'a> = &'a mut dyn FnMut(usize, StepGrads) -> Result<()>;

/// One optimizer step's gradients from both runs (and the big batch's).
pub struct StepGrads {
    pub accumulation: Params,
    pub ddp: Params,
    /// Per element, what rounding alone may make them differ by.
    pub allowed: Params,
    /// The big batch's gradients from the same weights, and what they may differ by.
    pub big: Option<(Params, Params)>,
}

/// What the accumulation thread hands over per step: its gradients, their bound, and the
/// big batch's pair.
type AccStep = (Params, Params, Option<(Params, Params)>);

/// Both runs inside one MPI world of W ranks: rank 0 runs the accumulation run on a thread
/// of its own beside its DDP share, and the big batch there too, restarting it from the
/// accumulation run before each step as DDP does. Returns (accumulation, DDP, big batch)
/// on rank 0, with their finals and buffers; each step's gradients went to `sink`.
pub fn lockstep(
    cfg: &TrainConfig,
    comm: &dyn Collective,
    sink: StepSink,
) -> Result<Option<(Trace, Trace, Option<Trace>)>> {
    if comm.rank() != 0 {
        let mut ddp = ddp_run(cfg, comm, DdpStart::Restarted)?;
        for s in 0..ddp.steps() {
            ddp.restart_from(None, comm)?;
            ddp.step(s)?;
            crate::profile::mark(&format!("ddp step {s}"));
        }
        ddp.finish()?;
        return Ok(None);
    }
    // The accumulation run never waits for DDP (DDP restarts from it, not the reverse), so
    // it runs ahead on a thread of its own, at most one step's state ahead: its core does
    // nothing else, while DDP shares, comparisons and the other ranks share the rest.
    // A closed channel means the other side stopped; its own error is the one returned.
    std::thread::scope(|scope| {
        let (state_tx, states) = sync_channel::<State>(1);
        let (grads_tx, grads) = sync_channel::<AccStep>(1);
        let (steps_tx, ddp_steps) = sync_channel::<usize>(1);
        let acc = scope.spawn(move || -> Result<Option<(Trace, Option<Trace>)>> {
            launch::pin_threads();
            let mut acc = accumulation_run(cfg)?;
            let mut big = if cfg.with_big_batch() { Some(big_batch_run(cfg)?) } else { None };
            crate::profile::mark("accumulation built");
            let Ok(ddp_steps) = ddp_steps.recv() else { return Ok(None) };
            // DDP may make more steps than the accumulation run (an injected split bug):
            // those restart from its last state.
            for s in 0..acc.steps().max(ddp_steps) {
                let state = acc.state()?;
                let big_grads = match big.as_mut().filter(|b| s < b.steps()) {
                    Some(b) => {
                        b.restart_local(&state);
                        Some(b.step(s)?)
                    }
                    None => None,
                };
                if s < ddp_steps && state_tx.send(state).is_err() {
                    return Ok(None);
                }
                let (g, allowed, allowed_big) = match s < acc.steps() {
                    true => (acc.step(s)?, acc.take_allowed(), acc.take_allowed_big()),
                    false => Default::default(),
                };
                crate::profile::mark(&format!("accumulation step {s}"));
                if grads_tx.send((g, allowed, big_grads.map(|b| (b, allowed_big)))).is_err() {
                    return Ok(None);
                }
            }
            let big = big.map(Run::finish).transpose()?;
            Ok(Some((acc.finish()?, big)))
        });
        let ddp = ddp_side(cfg, comm, steps_tx, &states, &grads, sink);
        drop((states, grads));
        match (acc.join().expect("the accumulation thread does not panic")?, ddp?) {
            (Some((acc, big)), Some(ddp)) => Ok(Some((acc, ddp, big))),
            _ => unreachable!("a side stops early only when the other failed"),
        }
    })
}

/// Rank 0's DDP share: restarts from each accumulation state, then hands both runs' step
/// gradients to `sink`. None when the accumulation thread stopped (it failed).
fn ddp_side(
    cfg: &TrainConfig,
    comm: &dyn Collective,
    steps_tx: SyncSender<usize>,
    states: &Receiver<State>,
    grads: &Receiver<AccStep>,
    sink: StepSink,
) -> Result<Option<Trace>> {
    let mut ddp = ddp_run(cfg, comm, DdpStart::Restarted)?;
    let ddp_steps = ddp.steps();
    let _ = steps_tx.send(ddp_steps);
    crate::profile::mark("ddp built");
    for s in 0..ddp_steps {
        let Ok(state) = states.recv() else { return Ok(None) };
        ddp.restart_from(Some(state), comm)?;
        let ddp_grads = ddp.step(s)?;
        crate::profile::mark(&format!("ddp step {s}"));
        let Ok((accumulation, allowed, big)) = grads.recv() else { return Ok(None) };
        sink(s, StepGrads { accumulation, ddp: ddp_grads, allowed, big })?;
        crate::profile::mark(&format!("compared step {s}"));
    }
    let ddp = ddp.finish()?;
    crate::profile::mark("ddp finished");
    // Steps the accumulation run makes beyond DDP's (an injected split bug) still compare.
    for (s, (accumulation, allowed, big)) in (ddp_steps..).zip(grads.iter()) {
        sink(s, StepGrads { accumulation, ddp: Params::new(), allowed, big })?;
    }
    Ok(Some(ddp))
}
