//! Lockstep: deep BatchNorm networks are numerically chaotic in float32 (rounding
//! differences grow about a million-fold per step), so two free-running runs drift apart
//! although they are mathematically equivalent. Here, before every optimizer step, every DDP
//! rank restarts from the accumulation run's weights and BatchNorm buffers, so a step's
//! difference measures that step's arithmetic alone. Each run keeps its own optimizer state:
//! momentum is linear in the gradients, so it carries per-step differences without
//! amplifying them, and nothing it holds feeds a forward pass.

use crate::collective::Collective;
use crate::config::TrainConfig;
use crate::error::Result;
use crate::trace::{Params, Trace};

use super::{accumulation_run, ddp_run};

/// Receives step `s`'s gradients from the accumulation run and from DDP as soon as both
/// exist, so they can be compared and dropped (memory stays flat in the number of steps).
pub type StepSink<'a> = &'a mut dyn FnMut(usize, Params, Params) -> Result<()>;

/// Both runs inside one MPI world of W ranks: rank 0 runs the accumulation run beside its
/// DDP share. Returns (accumulation, DDP) on rank 0, with their finals and buffers; each
/// step's gradients went to `sink`.
pub fn lockstep(cfg: &TrainConfig, comm: &dyn Collective, sink: StepSink) -> Result<Option<(Trace, Trace)>> {
    let root = comm.rank() == 0;
    let mut acc = if root { Some(accumulation_run(cfg)?) } else { None };
    let mut ddp = ddp_run(cfg, comm)?;
    let ddp_steps = ddp.steps();
    for s in 0..ddp_steps {
        if let Some(acc) = &acc {
            ddp.copy_state_from(acc);
        }
        ddp.broadcast_state(comm)?;
        let ddp_grads = ddp.step(s)?;
        if let Some(acc) = &mut acc {
            let acc_grads = if s < acc.steps() { acc.step(s)? } else { Params::new() };
            sink(s, acc_grads, ddp_grads)?;
        }
    }
    let ddp = ddp.finish()?;
    match acc {
        Some(mut acc) => {
            // Steps the accumulation run makes beyond DDP's (an injected split bug) still run.
            for s in ddp_steps..acc.steps() {
                let acc_grads = acc.step(s)?;
                sink(s, acc_grads, Params::new())?;
            }
            Ok(Some((acc.finish()?, ddp)))
        }
        None => Ok(None),
    }
}
