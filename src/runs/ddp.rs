use crate::collective::Collective;
use crate::config::TrainConfig;
use crate::error::{Error, Result};
use crate::inject::Bug;
use crate::sampler::{rank_batches, SamplerSpec};
use crate::trace::Trace;

use super::{DdpSide, DdpStart, Plan, Run};

/// One DDP rank: its own DistributedSampler shard (set_epoch each epoch), K/W micro-batches
/// under no_sync, each loss divided by K/W, then gradients averaged the way PyTorch's DDP
/// reducer does it. Buffers follow `broadcast_buffers=True`.
pub fn ddp_run<'a>(cfg: &TrainConfig, comm: &'a dyn Collective, start: DdpStart) -> Result<Run<'a>> {
    let (rank, world) = (comm.rank(), comm.world_size());
    if world != cfg.gpus {
        return Err(Error::bad_flag(
            "--gpus",
            format!("{} ranks were asked for but the MPI world has {world}", cfg.gpus),
            format!("launch with mpirun -np {} or pass --gpus {world}", cfg.gpus),
        ));
    }
    let spec = SamplerSpec::from_train(cfg);
    let sampler_epoch = |epoch: u64| if cfg.inject == Some(Bug::NoSetEpoch) { 0 } else { epoch };
    let micro_batches = |epoch: u64| rank_batches(&spec.shards(sampler_epoch(epoch))[rank], cfg.batch_size);
    let local = cfg.local_acc_steps();
    let zero_grad = cfg.inject != Some(Bug::StaleZeroGrad);
    let side = DdpSide { comm, broadcast_buffers: true, start };
    Run::new(cfg, Plan::new(cfg, micro_batches, local), local, zero_grad, Some(side))
}

/// One rank's whole trace, free-running; every rank returns the same gradients.
pub fn ddp_rank(cfg: &TrainConfig, comm: &dyn Collective) -> Result<Trace> {
    ddp_run(cfg, comm, DdpStart::Broadcast)?.run_all()
}
