//! Each optimizer step's learning-rate factor: the schedule read at the step's tick. A
//! tick is one optimizer step, unless a planted bug ticks it once per micro-batch.

use super::planted::Planted;
use crate::spec::TrainConfig;

/// f(tick of step s) for every step, given how many micro-batches each holds, ticking as
/// the run carrying `planted` ticks.
pub fn factors(cfg: &TrainConfig, micro_batches: impl IntoIterator<Item = usize>, planted: Planted) -> Vec<f64> {
    let schedule = cfg.optim.lr_schedule;
    let mut tick = 0;
    micro_batches
        .into_iter()
        .map(|n| {
            let f = schedule.factor(tick);
            tick += if planted.ticks_each_micro_batch() { n } else { 1 };
            f
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::StepPlan;
    use crate::spec::{Bug, Schedule, Shape};

    #[test]
    fn per_micro_batch_ticks_run_k_times_faster() {
        let mut cfg = TrainConfig::article();
        cfg.shape = Shape { data_size: 16, batch_size: 2, acc_steps: 4, ..cfg.shape };
        cfg.run.epochs = 2;
        cfg.optim.lr_schedule = Schedule::Warmup(4);
        let plan = StepPlan::accumulation(&cfg, None);
        assert_eq!(factors(&cfg, plan.steps.iter().map(Vec::len), Planted::default()), [0.25, 0.5, 0.75, 1.0]);
        assert_eq!(
            factors(&cfg, plan.steps.iter().map(Vec::len), Planted::accumulation(Some(Bug::SchedulePerMicroBatch))),
            [0.25, 1.0, 1.0, 1.0]
        );
    }
}
