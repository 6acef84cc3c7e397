//! A parting: where two runs (or one run's stages and their contracts) part, as facts only: the step, the
//! stage, the mechanism, the leg whose facts show it and the numbers measured there. Locators
//! make them; `own` names the owner, `advise` the words, `annotate` a known fix.

use super::owner::Owner;
use super::words::{Mechanism, Reason, Stage};
use crate::evidence::{Engine, Framework, RankHeld};
use crate::judge::{Problem, ScalerMismatch};

/// One of the two legs a comparison holds: `a` (left, the accumulation run) or `b` (right).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Left,
    Right,
}

impl Side {
    pub fn other(self) -> Side {
        match self {
            Side::Left => Side::Right,
            Side::Right => Side::Left,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Parting {
    /// The first step where the runs part, where one step shows it (None: the whole run).
    pub step: Option<usize>,
    /// Where a micro-batch's way parts; None where no stage can be named (rounding, NaN).
    pub stage: Option<Stage>,
    /// How: one owner rule and one advice each. Always `numbers.mechanism()`.
    pub mechanism: Mechanism,
    /// The leg whose recorded facts show it.
    pub leg: Option<Side>,
    /// What was measured, for the advice.
    pub numbers: Numbers,
}

impl Parting {
    pub fn new(step: Option<usize>, stage: Option<Stage>, leg: Option<Side>, numbers: Numbers) -> Parting {
        Parting { step, stage, mechanism: numbers.mechanism(), leg, numbers }
    }

    /// The short, stable reason reports and explore count by.
    pub fn reason(&self) -> Reason {
        self.numbers.reason()
    }
}

/// How a leg's data was dealt apart from the other's, by the recorded deal.
#[derive(Debug, Clone, PartialEq)]
pub enum Deal {
    /// DistributedSampler (or a framework's loader) padded with repeated samples.
    Padded { samples: usize, dataset: Option<usize>, repeated: Option<String>, world: usize },
    /// DistributedSampler(drop_last=True) left samples out.
    SamplerDropped { samples: usize, dataset: Option<usize>, world: usize },
    /// The loaders' drop_last left out these many samples per epoch, left and right.
    LoaderDropped { left: usize, right: usize },
    /// Micro-batches shorter than the batch size per epoch, left and right.
    ShortBatches { left: usize, right: usize },
}

/// What two legs' step counts say.
#[derive(Debug, Clone, PartialEq)]
pub enum Steps {
    /// `one` steps after every micro-batch (`n` steps), `other` after `k` (`m` steps).
    EveryMicroBatch { one: Side, n: usize, other: Side, m: usize, k: i64 },
    /// Neither accumulates though K > 1.
    Neither { k: usize, left: usize, right: usize },
    /// Typical backward passes per step differ.
    Cadences { left: (usize, i64), right: (usize, i64) },
    /// Step counts differ, not their cadence: the samplers' micro-batches.
    Counts { left: usize, right: usize },
}

/// What the per-forward sync flags of a step say of a rank's unsynchronised gradient.
#[derive(Debug, Clone, PartialEq)]
pub enum Synced {
    /// The flags: whether each micro-batch's backward was all-reduced.
    Flags(Vec<bool>),
    /// No DistributedDataParallel forward ran.
    NoDdpForward,
    /// Not recorded.
    Unknown,
}

/// How a loss was scaled before backward differently in one leg (`scaling` at the walk's
/// scaling stage), the split the facts allow.
#[derive(Debug, Clone, PartialEq)]
pub enum Scaled {
    /// A loss normalised over the window handed to an API that divided it by `by_api` again.
    NormalisedTwice { by_api: f64, api: Framework },
    /// Divided by `pre` before the API and by `by_api` inside it.
    Twice { pre: f64, by_api: f64, api: Framework },
    /// The API (`api`, the library whose backward divided) divided by the `n` micro-batches
    /// it was told, each process running `k`.
    ToldAll { n: usize, k: f64, api: Owner },
    /// The API scaled by `by_api` where 1/k averages.
    ByApi { by_api: f64, k: f64, api: Framework },
    /// The script's own scaling `sc`, `dev` times what its `k` micro-batches per process
    /// need; `handed` the framework the loss was handed to.
    Own { sc: f64, k: f64, dev: f64, handed: Framework },
}

/// A setting's value as a run recorded it.
#[derive(Debug, Clone, PartialEq)]
pub enum Told {
    /// A number, or None where the run's group has no such setting.
    Number(Option<f64>),
    Numbers(Vec<f64>),
    Flag(bool),
    /// The optimizer's class.
    Name(String),
}

/// Where DDP left the path a control run's rounding took, or why the control could not say.
#[derive(Debug, Clone, PartialEq)]
pub enum ControlPath {
    /// DDP's distance from accumulation there, and the control's (the largest over tensors
    /// of max|Δ| / max|value|), against the margin allowed.
    Left { ddp: f64, control: f64, margin: f64 },
    /// The control run did not repeat the accumulation run it nudged (why, in words).
    NotAControl(String),
    /// No control ran (traces compared as given).
    None,
    /// A leg ran narrower than float32 and no precision control measured its rounding
    /// (why, in words): held to float32's tolerance, which a narrow dtype's rounding exceeds.
    Precision(String),
}

/// The pace of one learning-rate schedule against the other's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pace {
    /// How many times as far along the faster schedule is.
    pub by: f64,
    /// The DDP (right) leg is the faster.
    pub ddp_ahead: bool,
    /// Counted from one rank's share (the DDP leg ahead by W), else ticked per micro-batch.
    pub per_rank_length: bool,
}

/// The numbers each mechanism's advice is written from.
#[derive(Debug, Clone, PartialEq)]
pub enum Numbers {
    OneProcess,
    DealtUnevenly(Deal),
    /// A framework planned `steps` optimizer steps for `epochs` epochs of `loader` batches at
    /// `accumulation` per step, too few for each epoch's partial last window of `left` batches.
    EpochCutShort {
        steps: usize,
        loader: usize,
        accumulation: usize,
        epochs: usize,
        left: usize,
    },
    UnreducedTail {
        engine: Engine,
        micro_batches: usize,
        tail: usize,
        moved: bool,
    },
    SteppedEarly {
        micro: i64,
        told: usize,
        calls: f64,
    },
    StepCount(Steps),
    /// The legs' weights as their first step found them differ (recorded checksums): one
    /// resumed from a checkpoint, or was initialised otherwise.
    OtherStart,
    EngineBoundary {
        per_step: usize,
        gas: usize,
    },
    Unsynced {
        rank: usize,
        param: String,
        synced: Synced,
    },
    RanksDiffer {
        rank: usize,
        tensor: RankHeld,
    },
    /// The reduction divided by `divide` where averaging divides by `world`; `configured`:
    /// the engine's divide factor was set to it (FSDP2's set_gradient_divide_factor).
    Reduction {
        divide: f64,
        world: usize,
        configured: bool,
    },
    /// `differ` of `total` micro-batches (or samples, where each sample was hashed: 1 in
    /// `samples` of them kept) are not the other leg's.
    DifferentInputs {
        missing: Option<(usize, usize)>,
        differ: usize,
        total: usize,
        samples: Option<u64>,
    },
    /// The epoch's last window held `held` micro-batches per process and each loss was
    /// still scaled by 1/`k`.
    WindowDivided {
        held: usize,
        k: usize,
    },
    /// The same samples in the step, grouped otherwise into micro-batches, where `layers` mix
    /// a micro-batch's samples while training.
    Regrouped {
        layers: String,
    },
    /// One run: ranks `ranks` trained on `shared` of the `of` samples the first of them
    /// held in one step (kept 1 in `every` by hash).
    SharedSamples {
        ranks: (usize, usize),
        shared: usize,
        of: usize,
        every: u64,
    },
    /// One run: the ranks' micro-batches were passed other normalisers and each of their
    /// items weighs otherwise in the applied gradient: (rank, normaliser, what an item weighs).
    NormalisersApart {
        by_rank: Vec<(usize, f64, f64)>,
    },
    /// One rank's micro-batches each divided by a count of its own (`counts`, the
    /// num_items_in_batch each was passed, which its loss followed): the window's items weigh
    /// unequally.
    NormalisedPerMicroBatch {
        rank: usize,
        counts: Vec<f64>,
    },
    NormaliserPerRank {
        losses: (f64, f64),
        normalisers: (f64, f64),
        rank: usize,
    },
    /// `rank`: the DDP leg's rank of the first pair apart; None where no micro-batch
    /// pairs (the same samples grouped otherwise) and `losses` are each leg's mean.
    LossDiffers {
        losses: (f64, f64),
        rank: Option<usize>,
    },
    ZeroedInWindow {
        times: i64,
    },
    /// The legs ran a stage at other precisions: `what` (autocast, the weights' dtype), as
    /// each leg recorded it.
    PrecisionApart {
        what: &'static str,
        left: (crate::spec::Dtype, &'static str),
        right: (crate::spec::Dtype, &'static str),
    },
    /// A rank ran its forwards under another autocast than the first rank did (each
    /// micro-batch's `autocast`, as digits of its dtype: 0 off).
    RanksPrecision {
        rank: usize,
        digits: u32,
        first: (usize, u32),
    },
    ScaledInBackward {
        ratio: f64,
    },
    /// `ratio`: the right leg's gradients over the left's; `scales`: what each multiplied
    /// every loss by; `whole`: the ratio is a whole number (or its inverse).
    Scaling {
        ratio: f64,
        scales: (f64, f64),
        whole: bool,
        how: Scaled,
    },
    /// At step 0 a process's first micro-batch gave the same loss in both runs and a later
    /// one did not: the weights moved inside the accumulation window.
    MovedInWindow {
        losses: (f64, f64),
        rank: usize,
    },
    /// Each rank of one leg scaled its losses by a factor of its own (`scales`, by rank)
    /// where the other scaled every micro-batch by `one`.
    ScaledPerRank {
        scales: Vec<(usize, f64)>,
        one: f64,
    },
    LocalDiffers {
        param: String,
        sums: (f64, f64),
    },
    /// An engine's own accumulation lost micro-batches; `marked_by` marked the boundaries.
    Lost {
        marked_by: Option<Framework>,
    },
    LrSchedule {
        left: f64,
        right: f64,
        pace: Option<Pace>,
    },
    LossScaler(ScalerMismatch),
    NonFinite(Problem),
    ClipCount {
        left: i64,
        right: i64,
    },
    /// The applied gradient's norm after a clip to `max`: not `max`, so the clipped
    /// gradient changed before the step (reduced after each rank clipped its own).
    ClippedBeforeReduction {
        norm: f64,
        max: f64,
    },
    DropoutKeys,
    DropoutOn {
        layers: String,
    },
    Buffers,
    /// Optimizer `optimizer`'s param group `group` was told another `setting` in each run;
    /// `steady`: the right run's value over the left's, the same at every recorded step (a
    /// base value apart, not a schedule's pace).
    Setting {
        optimizer: usize,
        group: usize,
        setting: &'static str,
        left: Told,
        right: Told,
        steady: Option<f64>,
    },
    /// The runs' optimizers hold other param groups: `left` and `right` groups in all.
    GroupsDiffer {
        left: usize,
        right: usize,
    },
    /// The runs part beyond rounding's reach with no recorded fact apart: where they left
    /// rounding's path (a step, or the final weights where `step` is None), the tensors
    /// that part most there (name, fraction of the allowance used), and the control's
    /// measure where one ran.
    /// `finals_exact`: the runs' final weights agree bit for bit though a step's gradients
    /// part: the recording moment is in doubt before the training.
    Unexplained {
        tensors: Vec<(String, f64)>,
        control: Option<ControlPath>,
        finals_exact: bool,
    },
    /// `carried`: a bound was carried through the optimizer (ours, or derived);
    /// `amplifies`: the optimizer may amplify rounding (not SGD, which is linear).
    OptimizerStep {
        carried: bool,
        amplifies: bool,
    },
    Chaos {
        growth: Vec<f64>,
    },
    ExplicitTolerance {
        ulps: u64,
        allowed: u32,
    },
    NotKept,
    Stale,
    ClippedFactor {
        ratio: f64,
        before: f64,
        whole: bool,
        norm: (f64, f64),
    },
    OneFactor {
        ratio: f64,
        whole: bool,
        adam: bool,
    },
    /// `tensors` (the first few) alone are `ratio` times the other run's; the rest agree.
    TensorFactor {
        tensors: Vec<String>,
        ratio: f64,
        whole: bool,
    },
    TokenCountPerRank,
    Epoch {
        epoch: usize,
    },
    DifferentSamples,
    ShortWindow {
        ratio: f64,
    },
    TokenCount {
        ratio: f64,
    },
    BigBatchFactor {
        ratio: f64,
    },
    PerMicroBatchMean,
    HiddenFactor {
        ratio: f64,
        steps: usize,
        norms: (f64, f64),
        max: f64,
        whole: bool,
    },
    /// In the leg `label`: micro-batches reduced needlessly of those per rank, the megabytes
    /// they moved per step where recorded, and each leg's measured seconds per step.
    NeedlessSync {
        label: String,
        needless: usize,
        micro_batches: usize,
        megabytes: Option<f64>,
        times: Vec<(String, f64)>,
    },
    /// Rounding amplified, proven by the control run: each step's distance of DDP and of
    /// the control from accumulation, and the final weights' (last), DDP within `margin`
    /// times the control's throughout.
    AmplifiedRounding {
        ddp: Vec<f64>,
        control: Vec<f64>,
        margin: f64,
        scale: f64,
    },
    ShortBatches {
        shorts: usize,
    },
}

impl Numbers {
    pub fn mechanism(&self) -> Mechanism {
        self.kind().0
    }

    pub fn reason(&self) -> Reason {
        self.kind().1
    }

    /// How the runs part, and the reason reports count it under: one arm a variant.
    fn kind(&self) -> (Mechanism, Reason) {
        use Mechanism as M;
        use Numbers as N;
        use Reason as R;
        let factor = |whole: bool| if whole { R::LossScaling } else { R::UniformFactor };
        match self {
            N::OneProcess => (M::OneProcess, R::OneProcess),
            N::DealtUnevenly(_) => (M::DealtUnevenly, R::UnevenData),
            N::EpochCutShort { .. } => (M::EpochCutShort, R::EpochCutShort),
            N::UnreducedTail { .. } => (M::UnreducedTail, R::UnsyncedGradient),
            N::SteppedEarly { .. } => (M::SteppedEarly, R::StepCount),
            N::StepCount(_) => (M::StepCount, R::StepCount),
            N::OtherStart => (M::OtherStart, R::OtherStart),
            N::EngineBoundary { .. } => (M::EngineBoundary, R::EngineBoundary),
            N::Unsynced { .. } => (M::Unsynced, R::UnsyncedGradient),
            N::RanksDiffer { .. } => (M::RanksDiffer, R::RanksDiffer),
            N::Reduction { divide, world, .. } if *divide < *world as f64 => (M::Summed, R::SummedOverRanks),
            N::Reduction { .. } => (M::DividedAgain, R::SummedOverRanks),
            N::DifferentInputs { .. } => (M::DifferentInputs, R::DifferentSamples),
            N::Regrouped { .. } => (M::Regrouped, R::Regrouped),
            N::NormaliserPerRank { .. } | N::NormalisersApart { .. } => (M::NormaliserPerRank, R::TokenCountPerRank),
            N::NormalisedPerMicroBatch { .. } => (M::PerMicroBatchMean, R::PerMicroBatchMean),
            N::SharedSamples { .. } => (M::SharedSamples, R::DifferentSamples),
            N::LossDiffers { .. } => (M::LossDiffers, R::DifferentGradients),
            N::ZeroedInWindow { .. } => (M::ZeroedInWindow, R::ZeroedInWindow),
            N::PrecisionApart { .. } | N::RanksPrecision { .. } => (M::PrecisionApart, R::PrecisionApart),
            N::ScaledInBackward { .. } => (M::ScaledInBackward, R::LossScaling),
            N::Scaling { how: Scaled::NormalisedTwice { .. } | Scaled::Twice { .. }, whole, .. } => {
                (M::DividedTwice, factor(*whole))
            }
            N::Scaling { how: Scaled::ByApi { .. }, whole, .. } => (M::ApiScaled, factor(*whole)),
            N::Scaling { whole, .. } => (M::Scaled, factor(*whole)),
            N::LocalDiffers { .. } => (M::LocalDiffers, R::DifferentGradients),
            N::MovedInWindow { .. } => (M::MovedInWindow, R::DifferentGradients),
            N::ScaledPerRank { .. } => (M::ScaledPerRank, R::TokenCountPerRank),
            N::Lost { marked_by: Some(_) } => (M::LostBetweenMarks, R::DifferentGradients),
            N::Lost { marked_by: None } => (M::LostMicroBatches, R::DifferentGradients),
            N::LrSchedule { .. } => (M::LrSchedule, R::LrSchedule),
            N::LossScaler(_) => (M::LossScaler, R::LossScaler),
            N::NonFinite(_) => (M::NonFinite, R::NonFinite),
            N::ClipCount { .. } => (M::ClipCount, R::GradientClipping),
            N::ClippedBeforeReduction { .. } => (M::ClippedBeforeReduction, R::GradientClipping),
            N::DropoutKeys => (M::DropoutKeys, R::DropoutMasks),
            N::DropoutOn { .. } => (M::DropoutOn, R::DropoutMasks),
            N::Buffers => (M::Buffers, R::Buffers),
            N::OptimizerStep { .. } => (M::OptimizerStep, R::OptimizerStep),
            N::Setting { .. } => (M::SettingDiffers, R::OptimizerSettings),
            N::GroupsDiffer { .. } => (M::GroupsDiffer, R::OptimizerSettings),
            N::Unexplained { .. } => (M::Unexplained, R::Unexplained),
            N::Chaos { .. } => (M::Chaos, R::Chaos),
            N::ExplicitTolerance { .. } => (M::ExplicitTolerance, R::ExplicitTolerance),
            N::NotKept => (M::NotKept, R::DifferentGradients),
            N::Stale => (M::Stale, R::StaleGradients),
            N::ClippedFactor { whole, .. } => (M::ClippedFactor, factor(*whole)),
            N::OneFactor { whole, .. } => (M::OneFactor, factor(*whole)),
            N::TokenCountPerRank => (M::TokenCountPerRank, R::TokenCountPerRank),
            N::TensorFactor { .. } => (M::TensorFactor, R::DifferentGradients),
            N::Epoch { .. } => (M::Epoch, R::EpochDependentSampling),
            N::DifferentSamples => (M::DifferentSamples, R::DifferentSamples),
            N::ShortWindow { .. } | N::WindowDivided { .. } => (M::ShortWindow, R::ShortWindowScaling),
            N::TokenCount { .. } => (M::TokenCount, R::TokenCount),
            N::BigBatchFactor { .. } => (M::BigBatchFactor, R::LossScaling),
            N::PerMicroBatchMean => (M::PerMicroBatchMean, R::PerMicroBatchMean),
            N::HiddenFactor { .. } => (M::HiddenFactor, R::HiddenFactor),
            N::NeedlessSync { .. } => (M::NeedlessSync, R::NeedlessSync),
            N::AmplifiedRounding { .. } => (M::AmplifiedRounding, R::Chaos),
            N::ShortBatches { .. } => (M::ShortBatches, R::UnevenData),
        }
    }
}
