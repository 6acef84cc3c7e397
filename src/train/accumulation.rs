use crate::error::Result;
use crate::evidence::Trace;
use crate::plan::RunPlan;
use crate::spec::TrainConfig;

use super::Run;

/// One process, K micro-batches per step, each loss divided by K; micro-batches come from
/// the sampler that mimics the W ranks' split.
pub fn accumulation_run(cfg: &TrainConfig) -> Result<Run<'static>> {
    Run::new(cfg, RunPlan::accumulation(cfg), None)
}

/// The accumulation run's whole trace, free-running.
pub fn accumulation(cfg: &TrainConfig) -> Result<Trace> {
    accumulation_run(cfg)?.run_all()
}
