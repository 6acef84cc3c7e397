use crate::config::TrainConfig;
use crate::data;
use crate::error::Result;
use crate::inject::{self, Bug};
use crate::models::Linear;
use crate::sampler::{accumulation_order, SamplerSpec};
use crate::trace::Trace;

use super::{train, Schedule};

/// One process, K micro-batches per step, each loss divided by K; micro-batches come from
/// the sampler that mimics the W ranks' split.
pub fn accumulation(cfg: &TrainConfig) -> Result<Trace> {
    let data = data::linear_data(cfg.seed, cfg.data_size, cfg.features)?;
    let model = Linear::new(cfg.features);
    let spec = SamplerSpec::from_train(cfg);
    let micro_batches = |epoch: u64| -> Vec<Vec<i64>> {
        let order = match cfg.inject {
            Some(bug) => inject::accumulation_with(bug, cfg, epoch),
            None => accumulation_order(&spec.shards(epoch), cfg.batch_size),
        };
        order.into_iter().map(|m| m.indices).collect()
    };
    let loss_divisor = match cfg.inject {
        Some(Bug::NoLossScale) => 1,
        Some(Bug::DoubleScale) => cfg.acc_steps * cfg.gpus,
        _ => cfg.acc_steps,
    };
    let mut no_sync = |_: &[(String, tch::Tensor)]| Ok(());
    let schedule = Schedule {
        micro_batches: &micro_batches,
        window: cfg.acc_steps,
        loss_divisor,
        zero_grad: true,
        sync: &mut no_sync,
    };
    train(cfg, &model, &data, schedule)
}
