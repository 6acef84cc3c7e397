//! Known, realistic mistakes that can be planted in one of the two runs (`--inject`), so
//! users and tests can watch the gate fire. What each does to a configuration's plan is
//! `plan::bugs`; how a run plants it, `train`.

use serde::{Deserialize, Serialize};

use ddp_verify_cli::names;

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
        names::BUGS[self as usize]
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
}
