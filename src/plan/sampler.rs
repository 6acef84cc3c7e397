//! An exact port of `torch.utils.data.DistributedSampler`, and the single-device sampler
//! that mimics it: its micro-batches for an optimizer step are exactly the W ranks'
//! batches for that step (the article's `DummySampler`, generalised).

use serde::Serialize;

use crate::spec::TrainConfig;

/// The inputs of one `DistributedSampler` epoch shared by all ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SamplerSpec {
    pub data_size: usize,
    pub world: usize,
    pub shuffle: bool,
    pub seed: u64,
    pub drop_last: bool,
}

impl SamplerSpec {
    pub fn from_train(cfg: &TrainConfig) -> Self {
        SamplerSpec {
            data_size: cfg.shape.data_size,
            world: cfg.shape.gpus,
            shuffle: cfg.shape.shuffle,
            seed: cfg.shape.seed,
            drop_last: cfg.shape.drop_last,
        }
    }

    /// `DistributedSampler.num_samples`: samples per rank per epoch.
    pub fn num_samples(&self) -> usize {
        let (n, w) = (self.data_size, self.world);
        if self.drop_last && n % w != 0 {
            // ceil((n - w) / w), as torch computes it
            (n.saturating_sub(w)).div_ceil(w)
        } else {
            n.div_ceil(w)
        }
    }

    /// `list(DistributedSampler(..., rank=r))` after `set_epoch(epoch)`, for every rank.
    pub fn shards(&self, epoch: u64) -> Vec<Vec<i64>> {
        let n = self.data_size;
        let total = self.num_samples().saturating_mul(self.world);
        let mut indices: Vec<i64> = if self.shuffle {
            // torch: g = Generator(); g.manual_seed(seed + epoch); randperm(n, generator=g).
            super::randperm::randperm(n, self.seed.wrapping_add(epoch))
        } else {
            (0..n as i64).collect()
        };
        if self.drop_last {
            indices.truncate(total);
        } else {
            // Pad by repeating the list from its start until every rank has num_samples.
            let base = indices.clone();
            while indices.len() < total {
                let take = (total - indices.len()).min(base.len());
                indices.extend_from_slice(&base[..take]);
            }
        }
        // take/skip, not a slice: with drop_last and N < W every shard is empty (total 0).
        (0..self.world).map(|r| indices.iter().take(total).skip(r).step_by(self.world).copied().collect()).collect()
    }
}

/// One micro-batch of the single-device run, with the rank and local batch it mimics.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MicroBatch {
    pub rank: usize,
    pub local_batch: usize,
    pub indices: Vec<i64>,
}

/// A rank's batches as a `DataLoader(batch_size=B, drop_last=False)` over its shard yields them.
pub fn rank_batches(shard: &[i64], batch_size: usize) -> Vec<Vec<i64>> {
    shard.chunks(batch_size).map(<[i64]>::to_vec).collect()
}

/// The mimicking sampler's order for one epoch: local batch 0 of every rank, then local
/// batch 1, ... so that every window of K = W x K/W micro-batches holds exactly the ranks'
/// K/W batches of that window. Yielded as whole batches (a batch sampler), because a rank's
/// short last batch must stay a micro-batch of its own. Shards of unequal length (only a
/// planted bug makes them) simply run out early.
pub fn accumulation_order(shards: &[Vec<i64>], batch_size: usize) -> Vec<MicroBatch> {
    let per_rank: Vec<Vec<Vec<i64>>> = shards.iter().map(|s| rank_batches(s, batch_size)).collect();
    let nb = per_rank.iter().map(Vec::len).max().unwrap_or(0);
    let mut order = Vec::with_capacity(nb * shards.len());
    for local_batch in 0..nb {
        for (rank, batches) in per_rank.iter().enumerate() {
            if let Some(b) = batches.get(local_batch) {
                order.push(MicroBatch { rank, local_batch, indices: b.clone() });
            }
        }
    }
    order
}

/// Micro-batches each rank runs per epoch.
pub fn batches_per_rank(cfg: &TrainConfig) -> usize {
    SamplerSpec::from_train(cfg).num_samples().div_ceil(cfg.shape.batch_size)
}

/// Optimizer steps per epoch: the micro-batch counter restarts each epoch, so a partial
/// window at an epoch's end steps only later, when the next window completes, or at the
/// epoch's end with `--partial-window step`.
pub fn steps_per_epoch(cfg: &TrainConfig) -> usize {
    if cfg.shape.gpus == 0 || cfg.shape.acc_steps < cfg.shape.gpus {
        return 0;
    }
    match cfg.run.partial_window {
        crate::spec::PartialWindow::Carry => batches_per_rank(cfg) / cfg.local_acc_steps(),
        crate::spec::PartialWindow::Step => batches_per_rank(cfg).div_ceil(cfg.local_acc_steps()),
    }
}

/// Optimizer steps over the whole run.
pub fn optimizer_steps(cfg: &TrainConfig) -> usize {
    let all = cfg.run.epochs * steps_per_epoch(cfg);
    cfg.run.max_steps.map_or(all, |m| all.min(m))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(n: usize, w: usize, drop_last: bool) -> SamplerSpec {
        SamplerSpec { data_size: n, world: w, shuffle: false, seed: 0, drop_last }
    }

    #[test]
    fn article_split_is_rank_strided() {
        assert_eq!(spec(8, 2, false).shards(0), vec![vec![0, 2, 4, 6], vec![1, 3, 5, 7]]);
    }

    #[test]
    fn padding_repeats_from_the_start() {
        assert_eq!(spec(5, 3, false).shards(0), vec![vec![0, 3], vec![1, 4], vec![2, 0]]);
        assert_eq!(spec(2, 5, false).num_samples(), 1);
    }

    #[test]
    fn drop_last_truncates() {
        assert_eq!(spec(5, 3, true).shards(0), vec![vec![0], vec![1], vec![2]]);
    }

    #[test]
    fn accumulation_order_interleaves_ranks_per_local_batch() {
        let order = accumulation_order(&spec(8, 2, false).shards(0), 4);
        let idx: Vec<_> = order.iter().map(|m| m.indices.clone()).collect();
        assert_eq!(idx, vec![vec![0, 2, 4, 6], vec![1, 3, 5, 7]]);
    }
}
