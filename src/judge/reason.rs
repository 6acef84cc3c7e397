//! Why two runs differ, as a type: reports and explore's tallies show `name()`, code matches
//! the variant. Each name is written beside its variant, so reordering cannot swap them.

use serde::{Serialize, Serializer};

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
}

impl Reason {
    pub const ALL: [Reason; 24] = [
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
        }
    }
}

impl Serialize for Reason {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

#[cfg(test)]
mod tests {
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
