//! When a planted bug matters, and what it needs. Each bug says whether it can change the
//! mathematics of a given configuration, from the plans themselves, so a config it cannot
//! change is reported as such instead of as a miss; and what it misuses (AdamW, clipping, a
//! loss scaler...), which `--inject` requires and explore provides. What each bug does is
//! `plan::planted`.

use super::planted::Planted;
use super::sampler::MicroBatch;
use super::steps::StepPlan;
use crate::spec::{Amp, Bug, Dtype, Optimizer, Schedule, TrainConfig};

/// True when the buggy run sees other samples per step, or other scaling, than the
/// correct one: only then must the gate fire.
pub fn changes_math(bug: Bug, cfg: &TrainConfig) -> bool {
    effect(bug, cfg) == Effect::Math
}

/// What `bug` does to this configuration's computation, from the step plans.
pub fn effect(bug: Bug, cfg: &TrainConfig) -> Effect {
    let whether = |changes: bool| if changes { Effect::Math } else { Effect::None };
    let correct = StepPlan::accumulation(cfg, None);
    let buggy = match bug {
        // Harmless where every window's divisor is 1 (K = 1, or only one-micro-batch
        // windows stepping on their own).
        Bug::NoLossScale | Bug::AdamwNoLossScale => {
            let step = cfg.run.partial_window == crate::spec::PartialWindow::Step;
            let divisor =
                |s: &Vec<Vec<i64>>| if step && s.len() < cfg.shape.acc_steps { s.len() } else { cfg.shape.acc_steps };
            return whether(correct.steps.iter().any(|s| divisor(s) > 1));
        }
        Bug::DoubleScale | Bug::UnsyncedParam => return whether(cfg.shape.gpus > 1),
        Bug::DropoutSameSeed => {
            return whether(
                cfg.model.lm.dropout > 0.0
                    && (0..cfg.shape.gpus).any(|r| counters_differ(&StepPlan::rank(cfg, r, None))),
            )
        }
        // Whether a gradient reaches the max norm is the data's to say: assumed.
        // Under a loss scaler it clips the scaled gradient, even one micro-batch's.
        Bug::ClipPerMicroBatch => {
            return whether(correct.steps.iter().any(|s| s.len() > 1) || cfg.precision.amp.scaled())
        }
        Bug::SchedulePerMicroBatch => {
            let factors = |p| super::schedule::factors(cfg, correct.steps.iter().map(Vec::len), p);
            return whether(factors(Planted::default()) != factors(Planted::accumulation(Some(bug))));
        }
        // Shows in a step after the first, unless that step is the loss scaler's planted
        // overflow: skipped by both runs, it compares nothing (an overflow at step 0 leaves
        // inf behind in the buggy run's gradients, which step 1 then shows).
        Bug::StaleZeroGrad => {
            let skipped = cfg.precision.amp.overflow_step;
            return whether((1..correct.steps.len()).any(|s| Some(s) != skipped));
        }
        // Each step records how often it unscaled and updated the scale: a window of
        // several micro-batches shows the bug there, whatever the numbers do.
        Bug::UnscalePerMicroBatch | Bug::ScalerUpdatePerMicroBatch => {
            return whether(correct.steps.iter().any(|s| s.len() > 1))
        }
        Bug::LastWindowByK => return whether(correct.steps.iter().any(|s| s.len() < cfg.shape.acc_steps)),
        // Token counts differ between micro-batches (or ranks) unless every sequence has
        // the same length and every micro-batch as many sequences.
        Bug::MeanPerMicroBatch => return whether(!same_counts(cfg, &correct.steps, |j| j)),
        Bug::CountPerRank => {
            return whether(cfg.shape.gpus > 1 && !same_counts(cfg, &correct.steps, |j| j % cfg.shape.gpus))
        }
        Bug::ContiguousSplit | Bug::NoPadding => StepPlan::accumulation(cfg, Some(bug)),
        // What the W ranks see together: epoch 0's split every epoch.
        Bug::NoSetEpoch => {
            StepPlan::walk(cfg, |_| indices(Planted::default().accumulation_micro_batches(cfg, 0)), cfg.shape.acc_steps)
        }
        // Never harmless (count-before-shift: every sample has one more input token than
        // targets), nor any bug not listed above: explore then calls a draw where it is
        // harmless a miss, which says to list it, and never hides one.
        _ => return Effect::Math,
    };
    match (as_math(cfg, &correct.steps) != as_math(cfg, &buggy.steps), correct.steps != buggy.steps) {
        (true, _) => Effect::Math,
        (false, true) => Effect::Order,
        (false, false) => Effect::None,
    }
}

/// Whether a rank's n-th sample of some epoch is not sample n: then keying dropout by the
/// rank's counter draws other masks than keying it by the sample.
fn counters_differ(plan: &StepPlan) -> bool {
    let mut seen = (None, 0i64);
    plan.steps.iter().zip(&plan.epochs).any(|(step, &epoch)| {
        if seen.0 != Some(epoch) {
            seen = (Some(epoch), 0);
        }
        step.iter().flatten().any(|&i| {
            seen.1 += 1;
            i != seen.1 - 1
        })
    })
}

/// What a planted bug does to one configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// Nothing: both plans are the same, so the gate must stay quiet.
    None,
    /// The same samples in the same micro-batches, added in another order: only rounding
    /// changes, which the derived bound (exact about DDP's order) may or may not notice.
    Order,
    /// Other samples, groupings or scaling: the gate must fire.
    Math,
}

/// Whether every group of a step's micro-batches (by `group(j)` of the micro-batch's
/// position: itself, or the rank it mimics) holds as many target tokens as the others of
/// its step, from the lengths the seed draws.
fn same_counts(cfg: &TrainConfig, steps: &[Vec<Vec<i64>>], group: impl Fn(usize) -> usize) -> bool {
    let targets = super::tokens::targets(cfg);
    let count = |mb: &[i64]| mb.iter().map(|&i| targets.get(i as usize).copied().unwrap_or(0)).sum::<i64>();
    steps.iter().all(|s| {
        let mut counts = std::collections::BTreeMap::<usize, i64>::new();
        for (j, mb) in s.iter().enumerate() {
            *counts.entry(group(j)).or_default() += count(mb);
        }
        counts.values().all(|&n| Some(&n) == counts.values().next())
    })
}

fn indices(order: Vec<MicroBatch>) -> Vec<Vec<i64>> {
    order.into_iter().map(|m| m.indices).collect()
}

/// A plan's steps as the mathematics sees them. Without BatchNorm a step's gradient is
/// the sum of its samples' terms over the step's normaliser (K, a short window's count, or
/// its target tokens), so each step is each sample's weight: its count over that divisor
/// (a repeated sample in a window of two weighs what it does alone in a window of one).
/// With BatchNorm it also depends on how they are grouped into micro-batches, so for
/// ResNets each step is its sorted list of sorted micro-batches.
fn as_math(cfg: &TrainConfig, steps: &[Vec<Vec<i64>>]) -> Vec<Vec<Vec<i64>>> {
    let targets = if cfg.model.kind.token_loss() { super::tokens::targets(cfg) } else { Vec::new() };
    let step_mode = cfg.run.partial_window == crate::spec::PartialWindow::Step;
    steps
        .iter()
        .map(|step| {
            let mut step: Vec<Vec<i64>> = step.clone();
            step.iter_mut().for_each(|m| m.sort_unstable());
            if !cfg.model.kind.is_resnet() {
                let divisor = match cfg.model.kind.token_loss() {
                    true => step.iter().flatten().map(|&i| targets.get(i as usize).copied().unwrap_or(0)).sum::<i64>(),
                    false if step_mode && step.len() < cfg.shape.acc_steps => step.len() as i64,
                    false => cfg.shape.acc_steps as i64,
                };
                let mut counts = std::collections::BTreeMap::<i64, i64>::new();
                for &i in step.iter().flatten() {
                    *counts.entry(i).or_default() += 1;
                }
                // Equal rationals divide to the same double: exact comparison is sound.
                let weights =
                    counts.iter().flat_map(|(&i, &n)| [i, (n as f64 / divisor.max(1) as f64).to_bits() as i64]);
                step = vec![weights.collect()];
            }
            step.sort();
            step
        })
        .collect()
}

/// Whether every micro-batch either run would see under `bug` (or none) holds at least
/// `least` samples: train-mode BatchNorm refuses one value per channel.
pub fn micro_batches_hold(cfg: &TrainConfig, bug: Option<Bug>, least: usize) -> bool {
    let planted = Planted::accumulation(bug);
    (0..cfg.run.epochs as u64)
        .all(|e| planted.accumulation_micro_batches(cfg, e).iter().all(|m| m.indices.len() >= least))
}

/// What a bug misuses, which a configuration must have for the bug to act at all:
/// `--inject` refuses a configuration without it (`plan::checks`), and explore gives it to
/// the configurations it draws (`jobs::explore::models::plant`).
pub struct Need {
    /// Whether a configuration has it.
    pub has: fn(&TrainConfig) -> bool,
    /// Why the bug cannot act without it, after the bug's name.
    pub why: &'static str,
    pub fix: &'static str,
    /// Gives it to a drawn configuration, so that the bug changes the mathematics.
    pub give: fn(&mut TrainConfig),
}

/// What `bug` needs, if anything.
pub fn need(bug: Bug) -> Option<Need> {
    let need = |has, why, fix, give| Some(Need { has, why, fix, give });
    match bug {
        Bug::AdamwNoLossScale => need(
            |t| t.optim.optimizer == Optimizer::AdamW,
            "is the missing 1/K under AdamW",
            "add --optimizer adamw, or inject no-loss-scale for SGD",
            |t| t.optim.optimizer = Optimizer::AdamW,
        ),
        // Only tiny-lm has dropout layers; other models are refused for the model.
        Bug::DropoutSameSeed => need(
            |t| t.model.lm.dropout != 0.0 || !t.model.kind.token_loss(),
            "misdraws dropout masks, and there is no dropout",
            "add --dropout P",
            |t| {
                if t.model.lm.dropout == 0.0 {
                    t.model.lm.dropout = 0.1
                }
            },
        ),
        Bug::UnscalePerMicroBatch => need(scaled, SCALER.0, SCALER.1, give_scaler),
        // A growth interval of 1 makes per-micro-batch updates grow the scale inside a window.
        Bug::ScalerUpdatePerMicroBatch => need(scaled, SCALER.0, SCALER.1, |t| {
            give_scaler(t);
            t.precision.amp.growth_interval = 1;
        }),
        // Clipping that always engages; float16's clipped gradients would be subnormal at
        // 1e-4, rounded to a few bits.
        Bug::ClipPerMicroBatch => need(
            |t| t.optim.clip_grad_norm.is_some(),
            "misplaces gradient clipping, and nothing is clipped",
            "add --clip-grad-norm X",
            |t| t.optim.clip_grad_norm = Some(if t.precision.dtype == Dtype::Float16 { 1e-2 } else { 1e-4 }),
        ),
        Bug::SchedulePerMicroBatch => need(
            |t| t.optim.lr_schedule != Schedule::Constant,
            "ticks the learning-rate schedule too often, and a constant one never changes",
            "add --lr-schedule warmup:N or cosine:N",
            |t| {
                if t.optim.lr_schedule == Schedule::Constant {
                    t.optim.lr_schedule = Schedule::Warmup(4)
                }
            },
        ),
        _ => None,
    }
}

/// The loss scaler's bugs' why and fix.
const SCALER: (&str, &str) = ("misuses the float16 loss scaler, and there is none", "add --amp float16");

fn scaled(t: &TrainConfig) -> bool {
    t.precision.amp.scaled()
}

/// float32 weights under float16 autocast: a GradScaler.
fn give_scaler(t: &mut TrainConfig) {
    t.precision.dtype = Dtype::Float32;
    t.precision.amp.amp = Some(Amp::Float16);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{AmpConfig, PartialWindow, Shape};

    /// explore's draw that reported a miss: 7 samples, B=2, K=3, one rank, the last window
    /// stepping alone, one epoch: two steps, the second the planted overflow.
    fn two_steps(overflow_step: Option<usize>) -> TrainConfig {
        let mut cfg = TrainConfig::article();
        cfg.shape = Shape { data_size: 7, batch_size: 2, acc_steps: 3, gpus: 1, ..cfg.shape };
        cfg.run.partial_window = PartialWindow::Step;
        cfg.run.epochs = 1;
        cfg.precision.amp = AmpConfig { amp: Some(Amp::Float16), init_scale: 16.0, growth_interval: 1, overflow_step };
        cfg
    }

    #[test]
    fn stale_gradients_cannot_show_where_the_only_later_step_is_skipped() {
        assert_eq!(StepPlan::accumulation(&two_steps(None), None).steps.len(), 2);
        assert_eq!(effect(Bug::StaleZeroGrad, &two_steps(Some(1))), Effect::None);
        assert_eq!(effect(Bug::StaleZeroGrad, &two_steps(None)), Effect::Math);
        assert_eq!(effect(Bug::StaleZeroGrad, &two_steps(Some(0))), Effect::Math);
    }
}
