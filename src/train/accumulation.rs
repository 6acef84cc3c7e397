use crate::error::Result;
use crate::evidence::Trace;
use crate::plan::RunPlan;
use crate::spec::TrainConfig;

use super::{Derives, Run};

/// One process, K micro-batches per step, each loss divided by K (tiny-lm: by the step's
/// target tokens); micro-batches come from the sampler that mimics the W ranks' split.
pub fn accumulation_run(cfg: &TrainConfig) -> Result<Run<'static>> {
    Run::new(cfg, RunPlan::accumulation(cfg), None, Derives::Bounds)
}

/// The accumulation run's whole trace, free-running.
pub fn accumulation(cfg: &TrainConfig) -> Result<Trace> {
    accumulation_run(cfg)?.run_all()
}

/// One process, one micro-batch of each step's K·B samples, normalised over the whole
/// step: what accumulation must equal.
pub fn big_batch_run(cfg: &TrainConfig) -> Result<Run<'static>> {
    Run::new(cfg, RunPlan::big_batch(cfg), None, Derives::Nothing)
}

/// The big batch's whole trace, free-running.
pub fn big_batch(cfg: &TrainConfig) -> Result<Trace> {
    big_batch_run(cfg)?.run_all()
}
