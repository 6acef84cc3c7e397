//! What each planted bug does, in one place: a run carries at most one bug, and the plans
//! and the run ask it, at named points, whether to do otherwise (which samples, what the loss
//! is divided by, how the schedule ticks, what happens around backward and the step). What
//! a bug is (name, side, models) is `crates/cli`'s; when it changes the math, `plan::bugs`.
//!
//! A new bug that acts at an existing point is an arm in that point's answer here; one that
//! acts somewhere new is a new point here and one question in the run.

use super::sampler::{accumulation_order, MicroBatch, SamplerSpec};
use crate::spec::{Bug, TrainConfig};

/// The planted bug one run carries, if any: `Planted::default()` in honest runs and in the
/// big batch, which is the correct reference.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Planted(Option<Bug>);

impl Planted {
    /// The accumulation run's: every bug of its side or of both. dropout-same-seed too: it
    /// is the training loop's own, so the single process keys dropout by its counter as well
    /// (at W = 1 only the big batch can tell).
    pub fn accumulation(bug: Option<Bug>) -> Planted {
        Planted(bug.filter(|&b| b.side().in_accumulation() || b == Bug::DropoutSameSeed))
    }

    /// A DDP rank's: every bug of its side or of both.
    pub fn rank(bug: Option<Bug>) -> Planted {
        Planted(bug.filter(|b| b.side().in_ddp()))
    }

    pub fn bug(self) -> Option<Bug> {
        self.0
    }

    fn is(self, bug: Bug) -> bool {
        self.0 == Some(bug)
    }

    // Sampling.

    /// The epoch a DDP rank passes to `set_epoch`: every epoch's own, unless no-set-epoch
    /// forgets to call it.
    pub fn set_epoch(self, epoch: u64) -> u64 {
        if self.is(Bug::NoSetEpoch) {
            0
        } else {
            epoch
        }
    }

    /// The single-device run's micro-batches of `epoch`: the W ranks' strided shards,
    /// interleaved, or what contiguous-split and no-padding take instead.
    pub fn accumulation_micro_batches(self, cfg: &TrainConfig, epoch: u64) -> Vec<MicroBatch> {
        let spec = SamplerSpec::from_train(cfg);
        let shards = match self.0 {
            Some(Bug::ContiguousSplit) => contiguous_blocks(&spec.shards(epoch)),
            // With drop_last there is no padding to ignore.
            Some(Bug::NoPadding) if !spec.drop_last => unpadded_shards(&spec, epoch),
            _ => spec.shards(epoch),
        };
        accumulation_order(&shards, cfg.shape.batch_size)
    }

    // The loss's divisor (`plan::norm`).

    /// Each loss divided by 1, whatever the window holds (no-loss-scale, adamw-no-loss-scale).
    pub fn divides_by_one(self) -> bool {
        matches!(self.0, Some(Bug::NoLossScale | Bug::AdamwNoLossScale))
    }

    /// The divisor times W (double-scale).
    pub fn divides_again_by_world(self) -> bool {
        self.is(Bug::DoubleScale)
    }

    /// A short window divided as if it held K micro-batches (last-window-by-k).
    pub fn divides_short_window_by_full(self) -> bool {
        self.is(Bug::LastWindowByK)
    }

    /// Token counts: the rank's own instead of the step's (count-per-rank).
    pub fn counts_rank_tokens(self) -> bool {
        self.is(Bug::CountPerRank)
    }

    /// Token counts: the micro-batch's own, times the window (mean-per-micro-batch).
    pub fn counts_micro_batch_tokens(self) -> bool {
        self.is(Bug::MeanPerMicroBatch)
    }

    /// Token counts: inputs before the causal shift, not targets (count-before-shift).
    pub fn counts_before_shift(self) -> bool {
        self.is(Bug::CountBeforeShift)
    }

    // The learning-rate schedule (`plan::schedule`).

    /// Ticks after every micro-batch, not every step (schedule-per-micro-batch).
    pub fn ticks_each_micro_batch(self) -> bool {
        self.is(Bug::SchedulePerMicroBatch)
    }

    // At run time (`train::Run`).

    /// `optimizer.zero_grad()` after each step, unless stale-zero-grad forgets it.
    pub fn zeroes_grads(self) -> bool {
        !self.is(Bug::StaleZeroGrad)
    }

    /// Clips after every micro-batch's backward, not once per step (clip-per-micro-batch).
    pub fn clips_each_micro_batch(self) -> bool {
        self.is(Bug::ClipPerMicroBatch)
    }

    /// A DDP rank leaves its last registered parameter out of the all-reduce (unsynced-param).
    pub fn leaves_out_last_param(self) -> bool {
        self.is(Bug::UnsyncedParam)
    }

    /// Keys dropout by the run's own sample counter, not by the sample (dropout-same-seed).
    pub fn keys_dropout_by_counter(self) -> bool {
        self.is(Bug::DropoutSameSeed)
    }

    /// Under a loss scaler, unscales after every micro-batch (unscale-per-micro-batch).
    pub fn unscales_each_micro_batch(self) -> bool {
        self.is(Bug::UnscalePerMicroBatch)
    }

    /// Under a loss scaler, updates the scale after every micro-batch
    /// (scaler-update-per-micro-batch).
    pub fn updates_scale_each_micro_batch(self) -> bool {
        self.is(Bug::ScalerUpdatePerMicroBatch)
    }
}

/// Whether the accumulation run and the DDP ranks both carry `bug`: then only the big
/// batch, normalised correctly, can show it.
pub fn in_both_runs(bug: Bug) -> bool {
    Planted::accumulation(Some(bug)).bug().is_some() && Planted::rank(Some(bug)).bug().is_some()
}

/// The same padded index list as the strided shards, cut into W contiguous blocks instead
/// of taking every W-th index (contiguous-split).
fn contiguous_blocks(strided: &[Vec<i64>]) -> Vec<Vec<i64>> {
    let mut flat = vec![0; strided.len() * strided[0].len()];
    for (r, shard) in strided.iter().enumerate() {
        for (i, &x) in shard.iter().enumerate() {
            flat[i * strided.len() + r] = x;
        }
    }
    flat.chunks(strided[0].len()).map(<[i64]>::to_vec).collect()
}

/// The shards as if DistributedSampler did not pad (no-padding).
fn unpadded_shards(spec: &SamplerSpec, epoch: u64) -> Vec<Vec<i64>> {
    let padded = spec.shards(epoch);
    let total = spec.data_size;
    // The padded list is the permutation followed by repeats, and rank r holds its positions
    // r, r + W, ...: keep only positions below N.
    padded
        .iter()
        .enumerate()
        .map(|(r, shard)| {
            shard.iter().enumerate().filter(|(i, _)| i * spec.world + r < total).map(|(_, &x)| x).collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each run acts out only the bugs it carries: the DDP ranks' own never reach the
    /// accumulation run, and the other way round; dropout-same-seed reaches both.
    #[test]
    fn a_bug_acts_only_in_the_runs_that_carry_it() {
        let acc = |b| Planted::accumulation(Some(b));
        let rank = |b| Planted::rank(Some(b));
        assert!(acc(Bug::StaleZeroGrad).zeroes_grads() && !rank(Bug::StaleZeroGrad).zeroes_grads());
        assert!(acc(Bug::ClipPerMicroBatch).clips_each_micro_batch());
        assert!(!rank(Bug::ClipPerMicroBatch).clips_each_micro_batch());
        assert!(rank(Bug::UnsyncedParam).leaves_out_last_param());
        assert!(!acc(Bug::UnsyncedParam).leaves_out_last_param());
        assert!(acc(Bug::DropoutSameSeed).keys_dropout_by_counter());
        assert!(rank(Bug::DropoutSameSeed).keys_dropout_by_counter());
        assert!(rank(Bug::NoSetEpoch).set_epoch(3) == 0 && acc(Bug::NoSetEpoch).set_epoch(3) == 3);
        assert!(Planted::default().zeroes_grads() && Planted::default().set_epoch(2) == 2);
        for b in Bug::ALL {
            assert_eq!(in_both_runs(b), b.side() == crate::spec::Side::Both || b == Bug::DropoutSameSeed, "{b}");
        }
    }
}
