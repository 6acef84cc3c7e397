use crate::config::TrainConfig;
use crate::error::Result;
use crate::inject::{self, Bug};
use crate::sampler::{accumulation_order, SamplerSpec};
use crate::trace::Trace;

use super::{Plan, Run};

/// One process, K micro-batches per step, each loss divided by K; micro-batches come from
/// the sampler that mimics the W ranks' split.
pub fn accumulation_run(cfg: &TrainConfig) -> Result<Run<'static>> {
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
    Run::new(cfg, Plan::new(cfg, micro_batches, cfg.acc_steps), loss_divisor, true, None)
}

/// The accumulation run's whole trace, free-running.
pub fn accumulation(cfg: &TrainConfig) -> Result<Trace> {
    accumulation_run(cfg)?.run_all()
}
