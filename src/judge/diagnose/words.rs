//! The diagnosis's words: why two runs differ (`Reason`, reports' `diagnosis.reason` and
//! explore's tallies), where (`Stage`, in the order a micro-batch passes them) and how
//! (`Mechanism`, the known-fixes table's key). Each word is written beside its variant.

use crate::evidence::words::words;

words! {
    /// Why two runs differ, short and stable: code matches the variant, reports and explore's
    /// counts show the word.
    #[derive(PartialOrd, Ord, Hash)]
    pub enum Reason {
        Chaos = "chaos",
        StepCount = "step count",
        RanksDiffer = "ranks differ",
        LrSchedule = "learning-rate schedule",
        LossScaler = "loss scaler",
        NonFinite = "non-finite",
        ExplicitTolerance = "explicit tolerance",
        DifferentGradients = "different gradients",
        StaleGradients = "stale gradients",
        LossScaling = "loss scaling",
        TokenCountPerRank = "token count per rank",
        EpochDependentSampling = "epoch-dependent sampling",
        DifferentSamples = "different samples",
        ShortWindowScaling = "short window scaling",
        TokenCount = "token count",
        PerMicroBatchMean = "per-micro-batch mean",
        GradientClipping = "gradient clipping",
        DropoutMasks = "dropout masks",
        OtherStart = "other initial weights",
        UniformFactor = "uniform factor",
        UnsyncedGradient = "unsynchronised gradient",
        OneProcess = "one process",
        OptimizerStep = "optimizer step",
        Buffers = "buffers",
        HiddenFactor = "factor hidden by clipping",
        SummedOverRanks = "summed over ranks",
        EngineBoundary = "engine accumulation boundary",
        NeedlessSync = "needless synchronisation",
        ZeroedInWindow = "gradients zeroed in the window",
        UnevenData = "data dealt unevenly",
        EpochCutShort = "epoch cut short",
        OptimizerSettings = "optimizer settings",
        Unexplained = "unexplained difference",
        Regrouped = "samples grouped otherwise",
        PrecisionApart = "precision apart",
    }
}

words! {
    /// Where two trainings part, in the order a micro-batch passes them.
    #[derive(PartialOrd, Ord, Hash)]
    pub enum Stage {
        Samples = "samples",
        Precision = "precision",
        Loss = "loss",
        Scaling = "scaling",
        LocalGradient = "local gradient",
        Reduction = "reduction",
        Update = "update",
    }
}

words! {
    /// How the runs part at their stage: one mechanism, one owner rule and one advice
    /// (`own`, `advise`), whichever locator found it; the known-fixes table's key beside
    /// the library and the stage.
    pub enum Mechanism {
        // What ran.
        OneProcess = "one process",
        DealtUnevenly = "dealt unevenly",
        EpochCutShort = "epoch cut short",
        UnreducedTail = "unreduced micro-batches",
        SteppedEarly = "stepped early",
        StepCount = "step count",
        EngineBoundary = "engine accumulation boundary",
        // The ranks' synchronisation.
        Unsynced = "unsynchronised",
        RanksDiffer = "ranks differ",
        Summed = "summed",
        DividedAgain = "divided again",
        // The stages, from their recorded facts.
        DifferentInputs = "different inputs",
        SharedSamples = "same samples on several ranks",
        Regrouped = "samples grouped otherwise",
        PrecisionApart = "precision apart",
        NormaliserPerRank = "normaliser per rank",
        LossDiffers = "loss differs",
        ZeroedInWindow = "zeroed in window",
        ScaledInBackward = "scaled in backward",
        DividedTwice = "divided twice",
        Scaled = "scaled",
        ApiScaled = "api scaled",
        LocalDiffers = "local gradient differs",
        MovedInWindow = "weights moved inside the window",
        ScaledPerRank = "normaliser of each rank's own",
        LostMicroBatches = "lost micro-batches",
        LostBetweenMarks = "lost micro-batches between marked boundaries",
        // Recorded facts of the loss and the update.
        LrSchedule = "learning-rate schedule",
        LossScaler = "loss scaler",
        NonFinite = "non-finite",
        ClipCount = "clip count",
        ClippedBeforeReduction = "clipped before the reduction",
        DropoutKeys = "dropout keys",
        DropoutOn = "dropout on",
        OtherStart = "started from other weights",
        Buffers = "buffers",
        OptimizerStep = "optimizer step",
        SettingDiffers = "optimizer setting differs",
        GroupsDiffer = "param groups differ",
        // What rounding and the comparison explain.
        Chaos = "chaos",
        ExplicitTolerance = "explicit tolerance",
        NotKept = "gradients not kept",
        Unexplained = "unexplained",
        // The shape of the first differing step.
        Stale = "stale gradients",
        ClippedFactor = "factor clipped in one run",
        OneFactor = "one factor",
        TensorFactor = "some tensors' factor",
        TokenCountPerRank = "token count per rank",
        Epoch = "epoch",
        DifferentSamples = "different samples",
        // Against the big batch: what both runs share.
        ShortWindow = "short window",
        TokenCount = "token count",
        BigBatchFactor = "factor against the big batch",
        PerMicroBatchMean = "per-micro-batch mean",
        // Cautions beside an equivalence.
        HiddenFactor = "factor hidden by clipping",
        NeedlessSync = "needless synchronisation",
        AmplifiedRounding = "amplified rounding",
        ShortBatches = "short batches",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every reason has a word of its own, written as itself in JSON.
    #[test]
    fn every_reason_has_its_own_name() {
        let mut names = Reason::WORDS.to_vec();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Reason::ALL.len());
        for r in Reason::ALL {
            assert_eq!(serde_json::to_value(r).unwrap(), r.name());
            assert_eq!(Reason::parse(r.name()), Some(*r));
        }
    }

    #[test]
    fn stages_are_in_a_micro_batchs_order() {
        assert!(Stage::ALL.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(Stage::parse("local gradient"), Some(Stage::LocalGradient));
    }
}
