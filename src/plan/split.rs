//! What `ddp-verify split` shows: each rank's shard and the single-device order.

use serde::Serialize;

use super::sampler::{accumulation_order, SamplerSpec};
use crate::spec::TrainConfig;

/// What `ddp-verify split` shows: each rank's shard and the single-device order.
#[derive(Debug, Clone, Serialize)]
pub struct SplitPlan {
    pub data_size: usize,
    pub gpus: usize,
    pub batch_size: usize,
    pub acc_steps: usize,
    pub shuffle: bool,
    pub seed: u64,
    pub epoch: u64,
    pub drop_last: bool,
    /// `list(DistributedSampler(...))` for each rank.
    pub shards: Vec<Vec<i64>>,
    /// The single-device run's micro-batches, in order.
    pub accumulation_order: Vec<Vec<i64>>,
    /// The rank whose batch each micro-batch reproduces.
    pub micro_batch_ranks: Vec<usize>,
}

impl SplitPlan {
    pub fn new(cfg: &TrainConfig, epoch: u64) -> Self {
        let shards = SamplerSpec::from_train(cfg).shards(epoch);
        let order = accumulation_order(&shards, cfg.shape.batch_size);
        SplitPlan {
            data_size: cfg.shape.data_size,
            gpus: cfg.shape.gpus,
            batch_size: cfg.shape.batch_size,
            acc_steps: cfg.shape.acc_steps,
            shuffle: cfg.shape.shuffle,
            seed: cfg.shape.seed,
            epoch,
            drop_last: cfg.shape.drop_last,
            micro_batch_ranks: order.iter().map(|m| m.rank).collect(),
            accumulation_order: order.into_iter().map(|m| m.indices).collect(),
            shards,
        }
    }

    pub fn to_text(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let onoff = |b: bool| if b { "on" } else { "off" };
        let per_rank = self.shards.first().map_or(0, Vec::len);
        let padded = (per_rank * self.gpus).saturating_sub(self.data_size);
        let _ = writeln!(
            s,
            "DistributedSampler: N={} W={} shuffle {} seed {} epoch {} drop_last {}: {per_rank} samples per rank{}",
            self.data_size,
            self.gpus,
            onoff(self.shuffle),
            self.seed,
            self.epoch,
            onoff(self.drop_last),
            if padded > 0 && !self.drop_last { format!(", {padded} repeated as padding") } else { String::new() }
        );
        for (r, shard) in self.shards.iter().enumerate() {
            let _ = writeln!(s, "  rank {r}: {shard:?}");
        }
        let _ = writeln!(
            s,
            "accumulation order: batch {}, K={} micro-batches per optimizer step",
            self.batch_size, self.acc_steps
        );
        for (w, window) in self.accumulation_order.chunks(self.acc_steps).enumerate() {
            let label = if window.len() == self.acc_steps { format!("step {w}") } else { "carried".to_string() };
            let parts: Vec<String> = window
                .iter()
                .zip(&self.micro_batch_ranks[w * self.acc_steps..])
                .map(|(mb, r)| format!("{mb:?} (rank {r})"))
                .collect();
            let _ = writeln!(s, "  {label:>8}: {}", parts.join("  "));
        }
        if !self.accumulation_order.len().is_multiple_of(self.acc_steps) {
            let _ = writeln!(
                s,
                "  (a carried partial window keeps its gradient and is stepped with the next epoch's first window)"
            );
        }
        s
    }
}
