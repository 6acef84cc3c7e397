//! The step plan: which micro-batches each optimizer step of a run uses, following the
//! seed article's loop. The micro-batch counter restarts each epoch; a partial window at an
//! epoch's end keeps its gradient and steps with the next epoch's first window, as PyTorch
//! does with the same loop; `--max-steps` stops it. Written once here: the runs train from
//! it, and a planted bug's effect is judged by comparing plans.

use super::norm::Normaliser;
use super::planted::Planted;
use super::sampler::{rank_batches, SamplerSpec};
use crate::spec::{Bug, PartialWindow, TrainConfig};

/// The micro-batches (sample indices) of every optimizer step, in order, and those run
/// after the last step (forward and backward only: they still move BatchNorm's running
/// statistics).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepPlan {
    pub steps: Vec<Vec<Vec<i64>>>,
    pub tail: Vec<Vec<i64>>,
    /// The epoch whose sampler drew each step's last micro-batch, and the tail's (what
    /// dropout keys on; a step crosses epochs only when a window carries, which tiny-lm
    /// never does).
    pub epochs: Vec<u64>,
    pub tail_epoch: u64,
}

/// Which samples, which normalisation, which learning rates, and what a planted bug makes
/// the run do: one run's plan.
pub struct RunPlan {
    pub steps: StepPlan,
    pub norm: Normaliser,
    /// Each step's learning rate: lr times the schedule's factor at the step's tick.
    pub lrs: Vec<f64>,
    /// `--clip-grad-norm`.
    pub clip: Option<f64>,
    /// `--overflow-step`: the step, and which of this run's micro-batches in it overflows
    /// (the last rank's first: accumulation's W-th, that rank's first).
    pub overflow: Option<(usize, usize)>,
    pub planted: Planted,
}

impl StepPlan {
    /// `micro_batches(epoch)` in windows of `window`, the counter restarting each epoch; a
    /// short window at an epoch's end carries or steps (`--partial-window`); stops right
    /// after `--max-steps` steps.
    pub fn walk(cfg: &TrainConfig, micro_batches: impl Fn(u64) -> Vec<Vec<i64>>, window: usize) -> StepPlan {
        let (mut steps, mut open, mut epochs, mut tail_epoch) = (Vec::new(), Vec::new(), Vec::new(), 0);
        let step_short = cfg.run.partial_window == PartialWindow::Step;
        'epochs: for epoch in 0..cfg.run.epochs as u64 {
            tail_epoch = epoch;
            let epoch_batches = micro_batches(epoch);
            let n = epoch_batches.len();
            for (i, mb) in epoch_batches.into_iter().enumerate() {
                open.push(mb);
                if (i + 1) % window == 0 || (step_short && i + 1 == n) {
                    steps.push(std::mem::take(&mut open));
                    epochs.push(epoch);
                    if Some(steps.len()) == cfg.run.max_steps {
                        break 'epochs;
                    }
                }
            }
        }
        StepPlan { steps, tail: open, epochs, tail_epoch }
    }

    /// The big batch: each of the accumulation run's steps (without any planted bug) as
    /// one micro-batch of all its samples, in the same order.
    pub fn big_batch(cfg: &TrainConfig) -> StepPlan {
        let acc = StepPlan::accumulation(cfg, None);
        let tail = if acc.tail.is_empty() { Vec::new() } else { vec![acc.tail.concat()] };
        let steps = acc.steps.iter().map(|s| vec![s.concat()]).collect();
        StepPlan { steps, tail, epochs: acc.epochs, tail_epoch: acc.tail_epoch }
    }

    /// The single-device run: K micro-batches per step from the sampler that mimics the W
    /// ranks' split, with `bug` planted where that run carries it.
    pub fn accumulation(cfg: &TrainConfig, bug: Option<Bug>) -> StepPlan {
        let planted = Planted::accumulation(bug);
        let order = |e| planted.accumulation_micro_batches(cfg, e).into_iter().map(|m| m.indices).collect();
        StepPlan::walk(cfg, order, cfg.shape.acc_steps)
    }

    /// DDP rank `rank`: K/W micro-batches per step from its own DistributedSampler shard,
    /// after `set_epoch` as `bug` calls it, where a rank carries it.
    pub fn rank(cfg: &TrainConfig, rank: usize, bug: Option<Bug>) -> StepPlan {
        let (spec, planted) = (SamplerSpec::from_train(cfg), Planted::rank(bug));
        let order = |e| rank_batches(&spec.shards(planted.set_epoch(e))[rank], cfg.shape.batch_size);
        StepPlan::walk(cfg, order, cfg.local_acc_steps())
    }
}

impl RunPlan {
    /// A run's plan from its steps, carrying `planted`.
    fn new(cfg: &TrainConfig, steps: StepPlan, norm: Normaliser, planted: Planted) -> RunPlan {
        let lrs = super::schedule::factors(cfg, steps.steps.iter().map(Vec::len), planted)
            .iter()
            .map(|f| cfg.optim.lr * f)
            .collect();
        RunPlan { steps, norm, lrs, clip: cfg.optim.clip_grad_norm, overflow: None, planted }
    }

    pub fn accumulation(cfg: &TrainConfig) -> RunPlan {
        let steps = StepPlan::accumulation(cfg, cfg.inject);
        let plan = RunPlan::new(cfg, steps, Normaliser::accumulation(cfg), Planted::accumulation(cfg.inject));
        // Windows interleave the ranks' micro-batches: the last rank's first is the W-th.
        RunPlan { overflow: cfg.precision.amp.overflow_step.map(|s| (s, cfg.shape.gpus - 1)), ..plan }
    }

    pub fn ddp_rank(cfg: &TrainConfig, rank: usize) -> RunPlan {
        let steps = StepPlan::rank(cfg, rank, cfg.inject);
        let plan = RunPlan::new(cfg, steps, Normaliser::rank(cfg), Planted::rank(cfg.inject));
        let overflow = cfg.precision.amp.overflow_step.filter(|_| rank + 1 == cfg.shape.gpus).map(|s| (s, 0));
        RunPlan { overflow, ..plan }
    }

    /// One process, one micro-batch of K·B samples per step, normalised correctly: the
    /// reference that catches a normalisation both other runs get wrong alike.
    pub fn big_batch(cfg: &TrainConfig) -> RunPlan {
        let held: Vec<usize> = StepPlan::accumulation(cfg, None).steps.iter().map(Vec::len).collect();
        RunPlan::new(cfg, StepPlan::big_batch(cfg), Normaliser::big_batch(cfg, &held), Planted::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{RunShape, Shape};

    fn article(epochs: usize, max_steps: Option<usize>) -> TrainConfig {
        let shape = Shape { data_size: 6, gpus: 2, batch_size: 1, acc_steps: 4, ..Shape::article() };
        TrainConfig { shape, run: RunShape { epochs, max_steps, ..RunShape::article() }, ..TrainConfig::article() }
    }

    #[test]
    fn a_partial_window_carries_into_the_next_epoch() {
        // 3 micro-batches per rank per epoch, 2 per step, the counter restarting each epoch:
        // step 0 = epoch 0's first two; epoch 0's third is carried and steps with epoch 1's
        // first window (3 micro-batches); epoch 1's last is the tail.
        let plan = StepPlan::rank(&article(2, None), 0, None);
        assert_eq!(plan.steps, vec![vec![vec![0], vec![2]], vec![vec![4], vec![0], vec![2]]]);
        assert_eq!(plan.tail, vec![vec![4]]);
    }

    #[test]
    fn max_steps_stops_the_walk() {
        let plan = StepPlan::accumulation(&article(2, Some(1)), None);
        assert_eq!(plan.steps.len(), 1);
        assert_eq!(plan.steps[0], vec![vec![0], vec![1], vec![2], vec![3]]);
    }

    #[test]
    fn the_ranks_plans_cover_the_accumulation_plan_step_by_step() {
        let mut cfg = article(3, None);
        cfg.shape = Shape { shuffle: true, data_size: 11, gpus: 3, acc_steps: 6, ..cfg.shape };
        let acc = StepPlan::accumulation(&cfg, None);
        let ranks: Vec<StepPlan> = (0..cfg.shape.gpus).map(|r| StepPlan::rank(&cfg, r, None)).collect();
        assert!(!acc.steps.is_empty());
        for (s, step) in acc.steps.iter().enumerate() {
            let mut mine: Vec<Vec<i64>> = step.clone();
            let mut theirs: Vec<Vec<i64>> = ranks.iter().flat_map(|p| p.steps[s].clone()).collect();
            mine.sort();
            theirs.sort();
            assert_eq!(mine, theirs, "step {s}");
        }
    }
}
