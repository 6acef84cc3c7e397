//! What each micro-batch's loss is divided by, per run: K micro-batches (K/W on a rank)
//! for the linear model and ResNets, or the step's target tokens for tiny-lm. The rule is
//! written here once; a run applies it to the counts it finds (a DDP rank after
//! all-reducing its count, as current trainers do). Planted bugs change the rule, as
//! `plan::planted` says.

use super::planted::Planted;
use crate::spec::{PartialWindow, TrainConfig};

/// How one run normalises its losses.
#[derive(Debug, Clone, PartialEq)]
pub enum Normaliser {
    /// By micro-batches: `full` (K, or K/W on a rank) for a full window or one carried
    /// into the next epoch; a short window (`--partial-window step`, `steps_short`) by the
    /// micro-batches it holds, unless `short_by_full` (the last-window bug); the result
    /// `times` over (W for the double-scale bug, else 1). `fixed`: the no-loss-scale bug's
    /// divisor, whatever the window holds.
    MicroBatches { full: usize, times: usize, fixed: Option<usize>, steps_short: bool, short_by_full: bool },
    /// By target tokens (tiny-lm).
    Tokens(TokenNorm),
    /// The big batch of a model normalised by micro-batches: one value per step, the
    /// accumulation window's own divisor.
    PerStep(Vec<f64>),
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenNorm {
    /// Micro-batches of a full window on this run (K, K/W on a rank, 1 for the big batch).
    pub full: usize,
    /// DDP ranks: W, whose average the divisor T/W undoes; else 1.
    pub world: usize,
    pub scope: Scope,
    /// Counted after the causal shift (targets) or before it (inputs: the bug).
    pub before_shift: bool,
    pub short_by_full: bool,
}

/// Whose tokens the divisor counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The step's, over all ranks (all-reduced on a rank): correct.
    Step,
    /// The rank's own (the count-per-rank bug).
    Rank,
    /// The micro-batch's own, times the window's micro-batches (the mean-per-micro-batch bug).
    MicroBatch,
}

/// The token counts a run finds for one micro-batch of a step.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counts {
    /// The step's, all ranks together.
    pub step: f64,
    /// This run's share of the step (a rank's; the whole step elsewhere).
    pub own: f64,
    pub micro_batch: f64,
}

impl Normaliser {
    /// The accumulation run's, with the planted bug where that run carries it.
    pub fn accumulation(cfg: &TrainConfig) -> Normaliser {
        Normaliser::of(cfg, cfg.shape.acc_steps, 1, Planted::accumulation(cfg.inject))
    }

    /// A DDP rank's.
    pub fn rank(cfg: &TrainConfig) -> Normaliser {
        Normaliser::of(cfg, cfg.local_acc_steps(), cfg.shape.gpus, Planted::rank(cfg.inject))
    }

    fn of(cfg: &TrainConfig, full: usize, world: usize, planted: Planted) -> Normaliser {
        let short_by_full = planted.divides_short_window_by_full();
        if !cfg.model.kind.token_loss() {
            let fixed = planted.divides_by_one().then_some(1);
            let times = if planted.divides_again_by_world() { cfg.shape.gpus } else { 1 };
            let steps_short = cfg.run.partial_window == PartialWindow::Step;
            return Normaliser::MicroBatches { full, times, fixed, steps_short, short_by_full };
        }
        let scope = match (planted.counts_rank_tokens(), planted.counts_micro_batch_tokens()) {
            (true, _) => Scope::Rank,
            (_, true) => Scope::MicroBatch,
            _ => Scope::Step,
        };
        let before_shift = planted.counts_before_shift();
        Normaliser::Tokens(TokenNorm { full, world, scope, before_shift, short_by_full })
    }

    /// The big batch's: the step's tokens, or the accumulation window's own divisor for
    /// each step of `held` micro-batches (K for a full or carried window, its count for a
    /// short one).
    pub fn big_batch(cfg: &TrainConfig, held: &[usize]) -> Normaliser {
        if cfg.model.kind.token_loss() {
            let t = TokenNorm { full: 1, world: 1, scope: Scope::Step, before_shift: false, short_by_full: false };
            return Normaliser::Tokens(t);
        }
        let k = cfg.shape.acc_steps;
        let step = cfg.run.partial_window == PartialWindow::Step;
        Normaliser::PerStep(held.iter().map(|&h| if step && h < k { h } else { k } as f64).collect())
    }

    /// Whether the run must count tokens (and, on a rank, all-reduce them) before a step.
    pub fn counts_tokens(&self) -> Option<bool> {
        match self {
            Normaliser::Tokens(t) => Some(t.before_shift),
            _ => None,
        }
    }

    /// Whether a DDP rank must all-reduce its count.
    pub fn all_reduces(&self) -> bool {
        matches!(self, Normaliser::Tokens(t) if t.world > 1 && t.scope == Scope::Step)
    }

    /// What step `step`'s micro-batch is divided by, the step holding `held` micro-batches.
    pub fn divisor(&self, step: usize, held: usize, counts: Counts) -> f64 {
        match self {
            Normaliser::PerStep(d) => d.get(step).copied().unwrap_or(1.0),
            Normaliser::MicroBatches { fixed: Some(d), .. } => *d as f64,
            Normaliser::MicroBatches { full, times, fixed: None, steps_short, short_by_full } => {
                let window = if held < *full && *steps_short && !short_by_full { held } else { *full };
                (window * times) as f64
            }
            Normaliser::Tokens(t) => {
                let short = held < t.full;
                let window = if short && !t.short_by_full { held } else { t.full } as f64;
                match t.scope {
                    Scope::Step if short && t.short_by_full => {
                        counts.step / t.world as f64 * (t.full as f64 / held as f64)
                    }
                    Scope::Step => counts.step / t.world as f64,
                    Scope::Rank => counts.own,
                    Scope::MicroBatch => counts.micro_batch * window,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{Bug, ModelKind};

    fn lm(inject: Option<Bug>) -> TrainConfig {
        let mut t = TrainConfig { inject, ..TrainConfig::article() };
        (t.model.kind, t.shape.acc_steps, t.shape.gpus) = (ModelKind::TinyLm, 4, 2);
        t.run.partial_window = PartialWindow::Step;
        t
    }

    /// The step's 30 tokens, this rank's 12, this micro-batch's 5.
    const COUNTS: Counts = Counts { step: 30.0, own: 12.0, micro_batch: 5.0 };

    /// Accumulation divides by T, a rank by T/W (DDP's average makes it T); each bug as its
    /// issue describes it.
    #[test]
    fn token_divisors_follow_the_step_count_and_each_bug_its_own() {
        assert_eq!(Normaliser::accumulation(&lm(None)).divisor(0, 4, COUNTS), 30.0);
        assert_eq!(Normaliser::rank(&lm(None)).divisor(0, 2, COUNTS), 15.0);
        assert_eq!(Normaliser::rank(&lm(Some(Bug::CountPerRank))).divisor(0, 2, COUNTS), 12.0);
        assert_eq!(Normaliser::accumulation(&lm(Some(Bug::CountPerRank))).divisor(0, 4, COUNTS), 30.0);
        let mean = Some(Bug::MeanPerMicroBatch);
        assert_eq!(Normaliser::accumulation(&lm(mean)).divisor(0, 4, COUNTS), 20.0);
        assert_eq!(Normaliser::rank(&lm(mean)).divisor(0, 2, COUNTS), 10.0);
        // A short window of one micro-batch per rank (two in accumulation) divides by its
        // own tokens; the bug divides as if it held K, leaving K'/K = 1/2 of the gradient.
        let by_k = Some(Bug::LastWindowByK);
        assert_eq!(Normaliser::accumulation(&lm(None)).divisor(3, 2, COUNTS), 30.0);
        assert_eq!(Normaliser::accumulation(&lm(by_k)).divisor(3, 2, COUNTS), 60.0);
        assert_eq!(Normaliser::rank(&lm(by_k)).divisor(3, 1, COUNTS), 30.0);
    }

    #[test]
    fn micro_batch_divisors_follow_the_window_policy() {
        let linear = |partial_window, inject| {
            let mut t = TrainConfig { inject, ..TrainConfig::article() };
            (t.shape.acc_steps, t.shape.gpus, t.run.partial_window) = (4, 2, partial_window);
            t
        };
        let acc = |c| Normaliser::accumulation(&c);
        assert_eq!(acc(linear(PartialWindow::Carry, None)).divisor(0, 6, COUNTS), 4.0);
        assert_eq!(acc(linear(PartialWindow::Step, None)).divisor(0, 2, COUNTS), 2.0);
        assert_eq!(acc(linear(PartialWindow::Step, Some(Bug::LastWindowByK))).divisor(0, 2, COUNTS), 4.0);
        assert_eq!(acc(linear(PartialWindow::Step, Some(Bug::DoubleScale))).divisor(0, 2, COUNTS), 4.0);
        assert_eq!(acc(linear(PartialWindow::Carry, Some(Bug::NoLossScale))).divisor(0, 4, COUNTS), 1.0);
        let big = Normaliser::big_batch(&linear(PartialWindow::Step, None), &[4, 2]);
        assert_eq!((big.divisor(0, 1, COUNTS), big.divisor(1, 1, COUNTS)), (4.0, 2.0));
    }
}
