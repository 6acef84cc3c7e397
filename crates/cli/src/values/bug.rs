//! Known, realistic mistakes that can be planted in the runs (`--inject`), so users and
//! tests can watch the gate fire: what each one is, in one entry. What each does to a
//! run is the library's (`plan::planted`), and when it changes the mathematics (`plan::bugs`).

use super::ModelKind;

/// Every bug with everything it is, once: its name and help line (`--inject` and
/// `--help`), the run it lives in, the models that can carry it, and the configurations it
/// cannot change, in words.
macro_rules! bugs {
    (
        $(#[$meta:meta])*
        pub enum $ty:ident {
            $(
                $(#[$doc:meta])*
                $variant:ident = $name:literal {
                    side: $side:ident,
                    models: $models:ident,
                    harmless_when: $harmless:expr $(,)?
                },
            )+
        }
    ) => {
        values! {
            $(#[$meta])*
            pub enum $ty {
                $($(#[$doc])* $variant = $name,)+
            }
        }

        impl $ty {
            /// Which run carries the bug.
            pub fn side(self) -> Side {
                match self {
                    $($ty::$variant => Side::$side,)+
                }
            }

            /// The models that can carry it (and the gate see it in).
            pub fn models(self) -> Models {
                match self {
                    $($ty::$variant => Models::$models,)+
                }
            }

            /// The configurations this bug cannot change, in words.
            pub fn harmless_when(self) -> &'static str {
                match self {
                    $($ty::$variant => $harmless,)+
                }
            }
        }
    };
}

bugs! {
    /// A known mistake planted in the runs (`--inject`).
    pub enum Bug {
        /// accumulation forgets to divide each loss by K
        NoLossScale = "no-loss-scale" { side: Accumulation, models: DividedByK, harmless_when: "K = 1" },
        /// accumulation divides each loss by K and again by W
        DoubleScale = "double-scale" { side: Accumulation, models: DividedByK, harmless_when: "W = 1" },
        /// the single-device sampler takes contiguous blocks instead of the rank-strided split
        ContiguousSplit = "contiguous-split" {
            side: Accumulation,
            models: All,
            harmless_when: "each step sees the same samples either way (W = 1, or one step per epoch)",
        },
        /// DDP ranks never call set_epoch: every epoch reuses epoch 0's shuffle
        NoSetEpoch = "no-set-epoch" {
            side: Ddp,
            models: All,
            harmless_when: "no shuffle, one epoch, or one step covering each epoch",
        },
        /// the mimicking sampler ignores DistributedSampler's padding
        NoPadding = "no-padding" { side: Accumulation, models: All, harmless_when: "N divisible by W, or drop_last" },
        /// DDP ranks never zero their gradients after a step
        StaleZeroGrad = "stale-zero-grad" { side: Ddp, models: All, harmless_when: "a single optimizer step" },
        /// both runs average each micro-batch's loss over its own tokens, then divide by K (K/W
        /// on a rank): every token weighs 1/(its micro-batch's count), not 1/(the step's)
        MeanPerMicroBatch = "mean-per-micro-batch" {
            side: Both,
            models: TokenLoss,
            harmless_when: "every micro-batch of a step holding as many target tokens as the others",
        },
        /// each DDP rank divides by its own token count instead of the all-reduced one
        CountPerRank = "count-per-rank" {
            side: Ddp,
            models: TokenLoss,
            harmless_when: "W = 1, or every rank holding as many target tokens as the others",
        },
        /// both runs count tokens before the causal shift: every sample's L inputs, not its L - 1 targets
        CountBeforeShift = "count-before-shift" {
            side: Both,
            models: TokenLoss,
            harmless_when: "never: every sample has one more input token than targets",
        },
        /// with --partial-window step, both runs divide a short final window's loss as if it held K
        /// micro-batches
        LastWindowByK = "last-window-by-k" {
            side: Both,
            models: BigBatch,
            harmless_when: "no short window at an epoch's end (--partial-window carry, or windows that divide the epoch)",
        },
        /// accumulation clips after every micro-batch's backward (the partial sums), not once on the
        /// step's gradient
        ClipPerMicroBatch = "clip-per-micro-batch" {
            side: Accumulation,
            models: All,
            harmless_when: "K = 1 without a loss scaler, or a max norm that no step's gradient and no partial sum reaches",
        },
        /// accumulation ticks the learning-rate schedule after every micro-batch
        SchedulePerMicroBatch = "schedule-per-micro-batch" {
            side: Accumulation,
            models: All,
            harmless_when: "K = 1, or a schedule whose steps' learning rates the extra ticks leave alone",
        },
        /// accumulation forgets 1/K under AdamW, which hides it in the weights (Adam is nearly
        /// invariant to the gradient's scale) but not in the gradients
        AdamwNoLossScale = "adamw-no-loss-scale" { side: Accumulation, models: DividedByK, harmless_when: "K = 1" },
        /// DDP leaves one parameter (the last registered) out of the all-reduce: each rank steps it
        /// with its own gradient, and the ranks' models part
        UnsyncedParam = "unsynced-param" { side: Ddp, models: All, harmless_when: "W = 1" },
        /// DDP ranks key dropout by their own sample counter: every rank draws one mask stream
        /// (transformers#31412), where the masks must follow the samples
        DropoutSameSeed = "dropout-same-seed" {
            side: Ddp,
            models: Dropout,
            harmless_when: "every rank's n-th sample of an epoch being sample n (W = 1, no shuffle)",
        },
        /// accumulation unscales .grad after every micro-batch's backward (unscale_ inside the
        /// accumulation loop), not once per step: earlier micro-batches' shares are divided by the
        /// loss scale again and again (--amp float16)
        UnscalePerMicroBatch = "unscale-per-micro-batch" { side: Accumulation, models: All, harmless_when: "K = 1" },
        /// accumulation advances the loss scaler after every micro-batch, not once per optimizer step:
        /// the scale grows K times as often, and may change inside a window, whose micro-batches are
        /// then scaled by different factors but unscaled by one (--amp float16)
        ScalerUpdatePerMicroBatch = "scaler-update-per-micro-batch" {
            side: Accumulation,
            models: All,
            harmless_when: "K = 1",
        },
    }
}

impl Bug {
    /// Whether `model` can carry this bug (and the gate can see it).
    pub fn applies_to(self, model: ModelKind) -> bool {
        self.models().include(model)
    }
}

/// The models a bug can be planted in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Models {
    All,
    /// Bugs of the token-level loss: tiny-lm's.
    TokenLoss,
    /// Bugs of dropout: only tiny-lm has dropout layers.
    Dropout,
    /// Bugs of dividing by K: tiny-lm divides by tokens instead.
    DividedByK,
    /// Bugs both runs make alike, which only the big batch shows: ResNets have none.
    BigBatch,
}

impl Models {
    pub fn include(self, model: ModelKind) -> bool {
        match self {
            Models::All => true,
            Models::TokenLoss | Models::Dropout => model.token_loss(),
            Models::DividedByK => !model.token_loss(),
            Models::BigBatch => model.has_big_batch(),
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
