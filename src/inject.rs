//! Known, realistic mistakes that can be planted in one of the two runs, so users (and our
//! tests) can watch the gate fire. Each bug also says whether it can change the mathematics
//! of a given configuration, from the sampling plans themselves, so a config it cannot
//! change is reported as such instead of as a miss.

use serde::{Deserialize, Serialize};

use crate::config::TrainConfig;
use crate::sampler::{accumulation_order, MicroBatch, SamplerSpec};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Bug {
    /// Accumulation forgets to divide each loss by K.
    NoLossScale,
    /// Accumulation divides each loss by K and again by W.
    DoubleScale,
    /// The single-device sampler takes contiguous blocks instead of the rank-strided split.
    ContiguousSplit,
    /// DDP ranks never call set_epoch: every epoch reuses epoch 0's shuffle.
    NoSetEpoch,
    /// The mimicking sampler ignores DistributedSampler's padding.
    NoPadding,
    /// DDP ranks never zero their gradients after a step.
    StaleZeroGrad,
}

impl Bug {
    pub const ALL: [Bug; 6] =
        [Bug::NoLossScale, Bug::DoubleScale, Bug::ContiguousSplit, Bug::NoSetEpoch, Bug::NoPadding, Bug::StaleZeroGrad];

    pub fn name(self) -> &'static str {
        match self {
            Bug::NoLossScale => "no-loss-scale",
            Bug::DoubleScale => "double-scale",
            Bug::ContiguousSplit => "contiguous-split",
            Bug::NoSetEpoch => "no-set-epoch",
            Bug::NoPadding => "no-padding",
            Bug::StaleZeroGrad => "stale-zero-grad",
        }
    }

    pub fn parse(s: &str) -> Option<Bug> {
        Bug::ALL.into_iter().find(|b| b.name() == s)
    }

    /// The configurations this bug cannot change, in words.
    pub fn harmless_when(self) -> &'static str {
        match self {
            Bug::NoLossScale => "K = 1",
            Bug::DoubleScale => "W = 1",
            Bug::ContiguousSplit => "each step sees the same samples either way (W = 1, or one step per epoch)",
            Bug::NoSetEpoch => "no shuffle, one epoch, or one step covering each epoch",
            Bug::NoPadding => "N divisible by W, or drop_last",
            Bug::StaleZeroGrad => "a single optimizer step",
        }
    }

    /// Which run carries the bug.
    pub fn side(self) -> &'static str {
        match self {
            Bug::NoSetEpoch | Bug::StaleZeroGrad => "ddp",
            _ => "accumulation",
        }
    }

    /// True when the buggy run sees other samples per step, or other scaling, than the
    /// correct one: only then must the gate fire.
    pub fn changes_math(self, cfg: &TrainConfig) -> bool {
        self.effect(cfg) == Effect::Math
    }

    /// What the bug does to this configuration's computation, from the sampling plans.
    pub fn effect(self, cfg: &TrainConfig) -> Effect {
        let whether = |changes: bool| if changes { Effect::Math } else { Effect::None };
        let plans =
            |order: &dyn Fn(u64) -> Vec<MicroBatch>| (step_samples(cfg, order, true), step_samples(cfg, order, false));
        let correct = plans(&|e| correct_order(cfg, e));
        let buggy = match self {
            Bug::NoLossScale => return whether(cfg.acc_steps > 1),
            Bug::DoubleScale => return whether(cfg.gpus > 1),
            Bug::StaleZeroGrad => return whether(crate::sampler::optimizer_steps(cfg) > 1),
            Bug::ContiguousSplit | Bug::NoPadding => plans(&|e| accumulation_with(self, cfg, e)),
            Bug::NoSetEpoch => plans(&|_| correct_order(cfg, 0)),
        };
        match (correct.0 != buggy.0, correct.1 != buggy.1) {
            (true, _) => Effect::Math,
            (false, true) => Effect::Order,
            (false, false) => Effect::None,
        }
    }
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

fn correct_order(cfg: &TrainConfig, epoch: u64) -> Vec<MicroBatch> {
    accumulation_order(&SamplerSpec::from_train(cfg).shards(epoch), cfg.batch_size)
}

/// The samples behind each optimizer step, following the training loop: the counter
/// restarts each epoch, a partial window carries into the next one, and --max-steps stops
/// it. For the linear model a step's gradient depends on its multiset of samples alone;
/// with BatchNorm it also depends on how they are grouped into micro-batches, so for
/// ResNets each step is its sorted list of sorted micro-batches.
/// `math`: as sets (what the mathematics sees); else exactly, in order (what rounding sees).
fn step_samples(cfg: &TrainConfig, order: &dyn Fn(u64) -> Vec<MicroBatch>, math: bool) -> Vec<Vec<Vec<i64>>> {
    let mut steps = Vec::new();
    let mut window: Vec<Vec<i64>> = Vec::new();
    let max = cfg.max_steps.unwrap_or(usize::MAX);
    for epoch in 0..cfg.epochs as u64 {
        for (i, mb) in order(epoch).iter().enumerate() {
            let mut m = mb.indices.clone();
            if math {
                m.sort_unstable();
            }
            window.push(m);
            if (i + 1) % cfg.acc_steps == 0 && steps.len() < max {
                let mut step = std::mem::take(&mut window);
                if !math {
                    steps.push(step);
                    continue;
                }
                if !cfg.model.is_resnet() {
                    let mut all: Vec<i64> = step.concat();
                    all.sort_unstable();
                    step = vec![all];
                }
                step.sort();
                steps.push(step);
            }
        }
    }
    steps
}

/// Whether every micro-batch either run would see under `bug` (or none) holds at least
/// `least` samples: train-mode BatchNorm refuses one value per channel.
pub fn micro_batches_hold(cfg: &TrainConfig, bug: Option<Bug>, least: usize) -> bool {
    (0..cfg.epochs as u64).all(|e| {
        let order = match bug {
            Some(b) => accumulation_with(b, cfg, e),
            None => correct_order(cfg, e),
        };
        order.iter().all(|m| m.indices.len() >= least)
    })
}

/// The accumulation run's micro-batches for an epoch, with `bug` planted if it is a
/// sampler bug of that side.
pub fn accumulation_with(bug: Bug, cfg: &TrainConfig, epoch: u64) -> Vec<MicroBatch> {
    let spec = SamplerSpec::from_train(cfg);
    match bug {
        Bug::ContiguousSplit => {
            let strided = spec.shards(epoch);
            // Same padded index list, cut into W contiguous blocks instead of rank::W.
            let mut flat = vec![0; strided.len() * strided[0].len()];
            for (r, shard) in strided.iter().enumerate() {
                for (i, &x) in shard.iter().enumerate() {
                    flat[i * strided.len() + r] = x;
                }
            }
            let blocks: Vec<Vec<i64>> = flat.chunks(strided[0].len()).map(<[i64]>::to_vec).collect();
            accumulation_order(&blocks, cfg.batch_size)
        }
        // With drop_last there is no padding to ignore.
        Bug::NoPadding if !spec.drop_last => accumulation_order(&unpadded_shards(&spec, epoch), cfg.batch_size),
        _ => accumulation_order(&spec.shards(epoch), cfg.batch_size),
    }
}

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
