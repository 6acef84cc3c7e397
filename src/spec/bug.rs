//! Known, realistic mistakes that can be planted in one of the two runs (`--inject`), so
//! users and tests can watch the gate fire. What each does to a configuration's plan is
//! `plan::bugs`; how a run plants it, `train`.

use serde::{Deserialize, Serialize};

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
    /// Both runs average each micro-batch's loss over its own tokens, then divide by K
    /// (K/W on a rank): every token weighs 1/(its micro-batch's count), not 1/(the step's).
    MeanPerMicroBatch,
    /// Each DDP rank divides by its own token count instead of the all-reduced one.
    CountPerRank,
    /// Both runs count tokens before the causal shift: every sample's L inputs, not its
    /// L - 1 targets.
    CountBeforeShift,
    /// With `--partial-window step`, both runs divide a short final window's loss as if it
    /// held K micro-batches.
    LastWindowByK,
    /// Accumulation clips after every micro-batch's backward (the partial sums), not once
    /// on the step's gradient.
    ClipPerMicroBatch,
    /// Accumulation ticks the learning-rate schedule after every micro-batch.
    SchedulePerMicroBatch,
    /// Accumulation forgets 1/K under AdamW, which hides it in the weights (Adam is nearly
    /// invariant to the gradient's scale) but not in the gradients.
    AdamwNoLossScale,
    /// DDP leaves one parameter (the last registered) out of the all-reduce: each rank
    /// steps it with its own gradient, and the ranks' models part.
    UnsyncedParam,
    /// DDP ranks key dropout by their own sample counter: every rank draws one mask stream
    /// (transformers#31412), where the masks must follow the samples.
    DropoutSameSeed,
    /// Accumulation unscales `.grad` after every micro-batch's backward (`unscale_` inside
    /// the accumulation loop), not once per step: earlier micro-batches' shares are divided
    /// by the loss scale again and again.
    UnscalePerMicroBatch,
    /// Accumulation advances the loss scaler after every micro-batch, not once per optimizer
    /// step: the scale grows K times as often, and may change inside a window, whose
    /// micro-batches are then scaled by different factors but unscaled by one.
    ScalerUpdatePerMicroBatch,
}

impl Bug {
    pub const ALL: [Bug; 17] = [
        Bug::NoLossScale,
        Bug::DoubleScale,
        Bug::ContiguousSplit,
        Bug::NoSetEpoch,
        Bug::NoPadding,
        Bug::StaleZeroGrad,
        Bug::MeanPerMicroBatch,
        Bug::CountPerRank,
        Bug::CountBeforeShift,
        Bug::LastWindowByK,
        Bug::ClipPerMicroBatch,
        Bug::SchedulePerMicroBatch,
        Bug::AdamwNoLossScale,
        Bug::UnsyncedParam,
        Bug::DropoutSameSeed,
        Bug::UnscalePerMicroBatch,
        Bug::ScalerUpdatePerMicroBatch,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Bug::NoLossScale => "no-loss-scale",
            Bug::DoubleScale => "double-scale",
            Bug::ContiguousSplit => "contiguous-split",
            Bug::NoSetEpoch => "no-set-epoch",
            Bug::NoPadding => "no-padding",
            Bug::StaleZeroGrad => "stale-zero-grad",
            Bug::MeanPerMicroBatch => "mean-per-micro-batch",
            Bug::CountPerRank => "count-per-rank",
            Bug::CountBeforeShift => "count-before-shift",
            Bug::LastWindowByK => "last-window-by-k",
            Bug::ClipPerMicroBatch => "clip-per-micro-batch",
            Bug::SchedulePerMicroBatch => "schedule-per-micro-batch",
            Bug::AdamwNoLossScale => "adamw-no-loss-scale",
            Bug::UnsyncedParam => "unsynced-param",
            Bug::DropoutSameSeed => "dropout-same-seed",
            Bug::UnscalePerMicroBatch => "unscale-per-micro-batch",
            Bug::ScalerUpdatePerMicroBatch => "scaler-update-per-micro-batch",
        }
    }

    pub fn parse(s: &str) -> Option<Bug> {
        Bug::ALL.into_iter().find(|b| b.name() == s)
    }

    /// The configurations this bug cannot change, in words.
    pub fn harmless_when(self) -> &'static str {
        match self {
            Bug::NoLossScale | Bug::AdamwNoLossScale => "K = 1",
            Bug::UnsyncedParam => "W = 1",
            Bug::DropoutSameSeed => "every rank's n-th sample of an epoch being sample n (W = 1, no shuffle)",
            Bug::DoubleScale => "W = 1",
            Bug::ContiguousSplit => "each step sees the same samples either way (W = 1, or one step per epoch)",
            Bug::NoSetEpoch => "no shuffle, one epoch, or one step covering each epoch",
            Bug::NoPadding => "N divisible by W, or drop_last",
            Bug::StaleZeroGrad => "a single optimizer step",
            Bug::MeanPerMicroBatch => "every micro-batch of a step holding as many target tokens as the others",
            Bug::CountPerRank => "W = 1, or every rank holding as many target tokens as the others",
            Bug::CountBeforeShift => "never: every sample has one more input token than targets",
            Bug::LastWindowByK => {
                "no short window at an epoch's end (--partial-window carry, or windows that divide the epoch)"
            }
            Bug::ClipPerMicroBatch => {
                "K = 1 without a loss scaler, or a max norm that no step's gradient and no partial sum reaches"
            }
            Bug::SchedulePerMicroBatch => {
                "K = 1, or a schedule whose steps' learning rates the extra ticks leave alone"
            }
            Bug::UnscalePerMicroBatch | Bug::ScalerUpdatePerMicroBatch => "K = 1",
        }
    }

    /// Whether `model` can carry this bug (and the gate can see it): the token-count bugs
    /// need tiny-lm's token-level loss, and tiny-lm divides by tokens, not by K.
    pub fn applies_to(self, model: super::ModelKind) -> bool {
        match self {
            b if b.needs_token_loss() => model.token_loss(),
            // Only tiny-lm has dropout layers.
            Bug::DropoutSameSeed => model.token_loss(),
            Bug::NoLossScale | Bug::DoubleScale | Bug::AdamwNoLossScale => !model.token_loss(),
            // Both runs make it alike: only the big batch shows it, and ResNets have none.
            Bug::LastWindowByK => model.has_big_batch(),
            _ => true,
        }
    }

    /// Bugs of the token-level loss, which only tiny-lm has.
    pub fn needs_token_loss(self) -> bool {
        matches!(self, Bug::MeanPerMicroBatch | Bug::CountPerRank | Bug::CountBeforeShift)
    }

    /// Bugs both runs make alike, as shared training code would: only the big batch,
    /// which normalises its one batch correctly, can show them.
    pub fn in_both_runs(self) -> bool {
        matches!(self, Bug::MeanPerMicroBatch | Bug::CountBeforeShift | Bug::LastWindowByK)
    }

    /// Which run carries the bug.
    pub fn side(self) -> Side {
        match self {
            Bug::NoSetEpoch | Bug::StaleZeroGrad | Bug::CountPerRank | Bug::UnsyncedParam | Bug::DropoutSameSeed => {
                Side::Ddp
            }
            b if b.in_both_runs() => Side::Both,
            _ => Side::Accumulation,
        }
    }
}

/// The run a planted bug lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Accumulation,
    Ddp,
    /// Shared training code: every run makes it alike.
    Both,
}

impl Side {
    /// As reports say it: "planted in the ddp run".
    pub fn name(self) -> &'static str {
        match self {
            Side::Accumulation => "accumulation",
            Side::Ddp => "ddp",
            Side::Both => "both",
        }
    }

    /// Whether a run of this side carries the bug: the accumulation run (and the big batch)
    /// or a DDP rank.
    pub fn in_ddp(self) -> bool {
        self != Side::Accumulation
    }

    pub fn in_accumulation(self) -> bool {
        self != Side::Ddp
    }
}
