use crate::dist::Collective;
use crate::error::{Error, Result};
use crate::evidence::Trace;
use crate::plan::RunPlan;
use crate::spec::TrainConfig;

use super::{DdpSide, DdpStart, Derives, Run};

/// One DDP rank: its own DistributedSampler shard (set_epoch each epoch), K/W micro-batches
/// under no_sync, each loss divided by K/W, then gradients averaged the way PyTorch's DDP
/// reducer does it. Buffers follow `broadcast_buffers=True`.
pub fn ddp_run<'a>(cfg: &TrainConfig, comm: &'a dyn Collective, start: DdpStart) -> Result<Run<'a>> {
    let (rank, world) = (comm.rank(), comm.world_size());
    if world != cfg.shape.gpus {
        return Err(Error::bad_flag(
            "--gpus",
            format!("{} ranks were asked for but the MPI world has {world}", cfg.shape.gpus),
            format!("launch with mpirun -np {} or pass --gpus {world}", cfg.shape.gpus),
        ));
    }
    let side = DdpSide { comm, broadcast_buffers: true, start };
    Run::new(cfg, RunPlan::ddp_rank(cfg, rank), Some(side), Derives::Nothing)
}

/// One rank's whole trace, free-running; every rank returns the same gradients.
pub fn ddp_rank(cfg: &TrainConfig, comm: &dyn Collective) -> Result<Trace> {
    ddp_run(cfg, comm, DdpStart::Broadcast)?.run_all()
}
