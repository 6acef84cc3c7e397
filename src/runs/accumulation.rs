use crate::config::TrainConfig;
use crate::data;
use crate::error::Result;
use crate::models::Linear;
use crate::sampler::{accumulation_order, SamplerSpec};
use crate::trace::Trace;

use super::{train, Schedule};

/// One process, K micro-batches per step, each loss divided by K; micro-batches come from
/// the sampler that mimics the W ranks' split.
pub fn accumulation(cfg: &TrainConfig) -> Result<Trace> {
    let data = data::linear_data(cfg.seed, cfg.data_size, cfg.features);
    let model = Linear::new(cfg.features);
    let spec = SamplerSpec::from_train(cfg);
    let micro_batches = |epoch: u64| -> Vec<Vec<i64>> {
        accumulation_order(&spec.shards(epoch), cfg.batch_size).into_iter().map(|m| m.indices).collect()
    };
    let mut no_sync = |_: &[(String, tch::Tensor)]| Ok(());
    train(
        cfg,
        &model,
        &data,
        Schedule {
            micro_batches: &micro_batches,
            window: cfg.acc_steps,
            loss_divisor: cfg.acc_steps,
            sync: &mut no_sync,
        },
    )
}
