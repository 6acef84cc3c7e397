use tch::Tensor;

use crate::collective::{with_values, Collective};
use crate::config::TrainConfig;
use crate::data;
use crate::error::{Error, Result};
use crate::inject::Bug;
use crate::models::{Linear, Model};
use crate::sampler::{rank_batches, SamplerSpec};
use crate::trace::Trace;

use super::{train, Schedule};

/// One DDP rank: its own DistributedSampler shard (set_epoch each epoch), K/W micro-batches
/// under no_sync, each loss divided by K/W, then gradients averaged the way PyTorch's DDP
/// reducer does it: multiply by 1/W, then all-reduce SUM. Every rank returns the same trace.
pub fn ddp_rank(cfg: &TrainConfig, comm: &dyn Collective) -> Result<Trace> {
    let (rank, world) = (comm.rank(), comm.world_size());
    if world != cfg.gpus {
        return Err(Error::bad_flag(
            "--gpus",
            format!("{} ranks were asked for but the MPI world has {world}", cfg.gpus),
            format!("launch with mpirun -np {} or pass --gpus {world}", cfg.gpus),
        ));
    }
    let data = data::linear_data(cfg.seed, cfg.data_size, cfg.features)?;
    let model = Linear::new(cfg.features);
    // DDP's constructor broadcasts rank 0's parameters.
    for (_, p) in model.parameters() {
        with_values(&mut p.shallow_clone(), |v| comm.broadcast(v, 0))?;
    }
    let spec = SamplerSpec::from_train(cfg);
    let sampler_epoch = |epoch: u64| if cfg.inject == Some(Bug::NoSetEpoch) { 0 } else { epoch };
    let micro_batches = |epoch: u64| rank_batches(&spec.shards(sampler_epoch(epoch))[rank], cfg.batch_size);
    let scale = 1.0 / world as f64;
    let mut all_reduce = |params: &[(String, Tensor)]| -> Result<()> {
        for (_, p) in params {
            let mut g = p.grad();
            let _ = g.g_mul_scalar_(scale);
            with_values(&mut g, |v| comm.all_reduce_sum(v))?;
        }
        Ok(())
    };
    let local = cfg.local_acc_steps();
    let zero_grad = cfg.inject != Some(Bug::StaleZeroGrad);
    let schedule = Schedule {
        micro_batches: &micro_batches,
        window: local,
        loss_divisor: local,
        zero_grad,
        sync: &mut all_reduce,
    };
    train(cfg, &model, &data, schedule)
}
