//! Plain-words likely causes for a mismatch, as an ordered list of small rules over typed
//! evidence. Recorded facts come first (which processes ran, step counts, synchronisation,
//! learning rates, the loss scaler, clip counts, dropout): a fact the runs disagree on is
//! the cause, whatever the numbers look like. Then inferences from the shape of the
//! differences (chaos, a stale gradient, one factor, the samples). The first rule that
//! speaks names the cause; the last ones always speak, so a divergence always has one.

mod big_batch;
mod clipping;
mod context;
mod dropout;
mod evidence;
pub(crate) mod factor;
mod rounding;
mod samples;
pub(crate) mod scaling;
mod schedule;
mod stages;
mod steps;
mod sync;

use serde::{Serialize, Serializer};

pub use big_batch::big_batch;
pub use clipping::caution;
pub use context::{Context, Loss, Origin, ShortWindow};
pub use evidence::Evidence;
pub use stages::{Located, Stage};

use super::{Agreement, Comparison};
use crate::evidence::Trace;

/// Why two runs differ, as a type: reports and explore's tallies show `name()`, code matches
/// the variant. Each name is written beside its variant, so reordering cannot swap them. A
/// new cause is a variant here, its rule in `RULES` below, and the rule's function in its
/// family's file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reason {
    Chaos,
    StepCount,
    RanksDiffer,
    LrSchedule,
    LossScaler,
    NonFinite,
    ExplicitTolerance,
    DifferentGradients,
    StaleGradients,
    LossScaling,
    TokenCountPerRank,
    EpochDependentSampling,
    DifferentSamples,
    ShortWindowScaling,
    TokenCount,
    PerMicroBatchMean,
    GradientClipping,
    DropoutMasks,
    UniformFactor,
    UnsyncedGradient,
    OneProcess,
    OptimizerStep,
    Buffers,
    HiddenFactor,
    SummedOverRanks,
    EngineBoundary,
    NeedlessSync,
    ZeroedInWindow,
    UnevenData,
}

impl Reason {
    pub const ALL: [Reason; 29] = [
        Reason::Chaos,
        Reason::StepCount,
        Reason::RanksDiffer,
        Reason::LrSchedule,
        Reason::LossScaler,
        Reason::NonFinite,
        Reason::ExplicitTolerance,
        Reason::DifferentGradients,
        Reason::StaleGradients,
        Reason::LossScaling,
        Reason::TokenCountPerRank,
        Reason::EpochDependentSampling,
        Reason::DifferentSamples,
        Reason::ShortWindowScaling,
        Reason::TokenCount,
        Reason::PerMicroBatchMean,
        Reason::GradientClipping,
        Reason::DropoutMasks,
        Reason::UniformFactor,
        Reason::UnsyncedGradient,
        Reason::OneProcess,
        Reason::OptimizerStep,
        Reason::Buffers,
        Reason::HiddenFactor,
        Reason::SummedOverRanks,
        Reason::EngineBoundary,
        Reason::NeedlessSync,
        Reason::ZeroedInWindow,
        Reason::UnevenData,
    ];

    /// Short and stable: reports' `diagnosis.reason`, explore's counts by reason.
    pub fn name(self) -> &'static str {
        match self {
            Reason::Chaos => "chaos",
            Reason::StepCount => "step count",
            Reason::RanksDiffer => "ranks differ",
            Reason::LrSchedule => "learning-rate schedule",
            Reason::LossScaler => "loss scaler",
            Reason::NonFinite => "non-finite",
            Reason::ExplicitTolerance => "explicit tolerance",
            Reason::DifferentGradients => "different gradients",
            Reason::StaleGradients => "stale gradients",
            Reason::LossScaling => "loss scaling",
            Reason::TokenCountPerRank => "token count per rank",
            Reason::EpochDependentSampling => "epoch-dependent sampling",
            Reason::DifferentSamples => "different samples",
            Reason::ShortWindowScaling => "short window scaling",
            Reason::TokenCount => "token count",
            Reason::PerMicroBatchMean => "per-micro-batch mean",
            Reason::GradientClipping => "gradient clipping",
            Reason::DropoutMasks => "dropout masks",
            Reason::UniformFactor => "uniform factor",
            Reason::UnsyncedGradient => "unsynchronised gradient",
            Reason::OneProcess => "one process",
            Reason::OptimizerStep => "optimizer step",
            Reason::Buffers => "buffers",
            Reason::HiddenFactor => "factor hidden by clipping",
            Reason::SummedOverRanks => "summed over ranks",
            Reason::EngineBoundary => "engine accumulation boundary",
            Reason::NeedlessSync => "needless synchronisation",
            Reason::ZeroedInWindow => "gradients zeroed in the window",
            Reason::UnevenData => "data dealt unevenly",
        }
    }
}

impl Serialize for Reason {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Diagnosis {
    /// Short and stable, for counting by reason.
    pub reason: Reason,
    pub detail: String,
    /// The stage where the runs part and its owner (`stage`, `owner`, `known_fix` in a
    /// report): from the stage walk's recorded facts, else the reason's stage.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub located: Option<Located>,
}

impl Diagnosis {
    /// The located stage and owner in words ("the reduction stage, owned by torch 2.8.0
    /// (FSDP2's reduce-scatter)"), where located.
    pub fn where_(&self) -> Option<String> {
        let l = self.located.as_ref()?;
        Some(format!("the {} stage, owned by {}", l.stage.name(), l.owner.describe()))
    }

    fn new(reason: Reason, detail: impl Into<String>) -> Option<Diagnosis> {
        Some(Diagnosis { reason, detail: detail.into(), located: None })
    }
}

impl Reason {
    /// The stage a rule's cause sits at, where it has one (chaos and tolerances have none).
    pub fn stage(self) -> Option<Stage> {
        use Reason as R;
        Some(match self {
            R::Chaos | R::ExplicitTolerance | R::NonFinite | R::NeedlessSync => return None,
            R::DifferentSamples | R::EpochDependentSampling | R::UnevenData => Stage::Samples,
            R::TokenCountPerRank | R::TokenCount | R::PerMicroBatchMean | R::DropoutMasks => Stage::Loss,
            R::LossScaling | R::UniformFactor | R::ShortWindowScaling | R::LossScaler | R::HiddenFactor => {
                Stage::Scaling
            }
            R::DifferentGradients | R::StaleGradients | R::RanksDiffer | R::Buffers | R::ZeroedInWindow => {
                Stage::LocalGradient
            }
            R::OneProcess | R::UnsyncedGradient | R::SummedOverRanks | R::EngineBoundary => Stage::Reduction,
            R::StepCount | R::LrSchedule | R::OptimizerStep | R::GradientClipping => Stage::Update,
        })
    }
}

/// One rule: a name for docs and tests, and the test itself.
pub struct Rule {
    pub name: &'static str,
    pub test: fn(&Evidence) -> Option<Diagnosis>,
}

/// Accumulation against DDP, in order: facts, then what rounding explains, then the shape
/// of the first differing step.
pub const RULES: &[Rule] = &[
    Rule { name: "one process", test: sync::one_process },
    Rule { name: "data dealt unevenly", test: samples::uneven_data },
    Rule { name: "unreduced micro-batches", test: sync::unreduced_tail },
    Rule { name: "framework step gating", test: stages::cadence },
    Rule { name: "step count", test: steps::step_count },
    Rule { name: "engine accumulation boundary", test: steps::engine_boundary },
    Rule { name: "unsynchronised gradient", test: sync::unsynced },
    Rule { name: "ranks differ", test: sync::ranks_differ },
    Rule { name: "summed over ranks", test: sync::summed_over_ranks },
    Rule { name: "a library's stage", test: stages::library_at_fault },
    Rule { name: "learning-rate schedule", test: schedule::lr_schedule },
    Rule { name: "loss scaler", test: scaling::loss_scaler },
    Rule { name: "non-finite", test: rounding::non_finite },
    Rule { name: "clip count", test: clipping::clip_count },
    Rule { name: "dropout keys", test: dropout::keys },
    Rule { name: "user's dropout", test: dropout::users },
    Rule { name: "after the gradients", test: rounding::after_the_gradients },
    Rule { name: "chaos", test: rounding::chaos },
    Rule { name: "explicit tolerance", test: rounding::explicit_tolerance },
    Rule { name: "gradients not kept", test: rounding::not_kept },
    Rule { name: "stale gradients", test: steps::stale },
    Rule { name: "factor hidden by clipping", test: clipping::clipped_factor },
    Rule { name: "stages", test: stages::walk },
    Rule { name: "loss scaling", test: scaling::whole_factor },
    Rule { name: "uniform factor", test: scaling::uniform_factor },
    Rule { name: "token count per rank", test: samples::token_count_per_rank },
    Rule { name: "epoch", test: samples::epoch },
    Rule { name: "different samples", test: samples::different_samples },
];

/// The likely cause of a divergence between `a` and `b`, by the first rule that names one;
/// None where they agree.
pub fn diagnose(a: &Trace, b: &Trace, c: &Comparison, cx: &Context) -> Option<Diagnosis> {
    if c.verdict != Agreement::Diverged {
        return None;
    }
    let ev = Evidence::new(a, b, c, cx);
    // The stage walk speaks twice among the rules: where it found a library at fault, right
    // after the facts of the script's own synchronisation; where it found the script, before
    // the inferences from the gradients' shape. A cause it did not speak for takes the
    // stage its facts locate, else the reason's.
    let mut d = RULES.iter().find_map(|r| (r.test)(&ev))?;
    if d.located.is_none() && !cx.ours() {
        let owner = stages::rule_owner(&ev, d.reason);
        let walked = stages::walk(&ev).and_then(|w| w.located).map(|l| l.stage);
        // Ranks that part under an engine's own reduction part at that reduction.
        let stage = if owner.is_library() { Some(Stage::Reduction) } else { walked.or(d.reason.stage()) };
        if owner.is_library() {
            d.detail = format!(
                "{}. Here the ranks are synchronised by {} alone, inside its own backward and step, which the \
                 script cannot skip: the library's reduction, not your script: upgrade {}",
                d.detail.trim_end_matches('.'),
                owner.describe(),
                owner.name()
            );
        }
        d.located = stage.map(|stage| Located { stage, owner, known_fix: None });
    }
    Some(d)
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod reason_tests {
    use super::*;

    /// Every variant is listed once and has a name of its own.
    #[test]
    fn every_reason_has_its_own_name() {
        let mut names: Vec<&str> = Reason::ALL.iter().map(|r| r.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Reason::ALL.len());
        for (i, r) in Reason::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i, "{r:?} out of place in ALL");
            assert_eq!(serde_json::to_value(r).unwrap(), r.name());
        }
    }
}
