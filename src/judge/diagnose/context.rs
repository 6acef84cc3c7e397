//! What a diagnosis may assume about the runs behind two traces, from ddp-verify's own
//! configuration or from what two recorded traces say of themselves.

use crate::evidence::{Framework, Trace};
use crate::spec::{Dtype, TrainConfig};

/// Who trained the runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// ddp-verify: its flags can be named in a fix.
    Ours,
    /// A user's loop, recorded; with the framework that divides each loss by its
    /// accumulation steps itself, where one called the step.
    Recorded { framework: Option<Framework> },
}

/// How the loss is normalised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loss {
    /// By samples (or not said).
    PerSample,
    /// By token counts (tiny-lm), which a wrong count changes.
    PerToken,
}

/// The first step made by a window shorter than K (`--partial-window step`), with what it
/// holds over K: the factor dividing it by K would leave.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShortWindow {
    pub step: usize,
    pub fraction: f64,
}

#[derive(Debug, Clone, Copy)]
pub struct Context {
    pub origin: Origin,
    /// The runs' machine epsilon.
    pub eps: f64,
    /// Optimizer steps per epoch, when known: a mismatch that starts in a later epoch
    /// points at the sampler's epoch.
    pub steps_per_epoch: Option<usize>,
    /// Equivalent runs may drift apart step by step (a deep net trained free-running).
    pub chaos_possible: bool,
    pub loss: Loss,
    /// Whether both runs' plans put the same samples in every step, when known.
    pub same_samples: Option<bool>,
    pub first_short: Option<ShortWindow>,
    /// The optimizer is Adam's kind, which hides a gradient's scale from the weights.
    pub adam_family: bool,
}

impl Context {
    pub fn of_run(t: &TrainConfig) -> Self {
        use crate::plan::StepPlan;
        let acc = StepPlan::accumulation(t, t.inject);
        let ranks: Vec<StepPlan> = (0..t.shape.gpus).map(|r| StepPlan::rank(t, r, t.inject)).collect();
        let same_samples = acc.steps.len() == ranks[0].steps.len()
            && acc.steps.iter().enumerate().all(|(s, step)| {
                let mut mine: Vec<i64> = step.concat();
                let mut theirs: Vec<i64> = ranks.iter().flat_map(|p| p.steps[s].concat()).collect();
                mine.sort_unstable();
                theirs.sort_unstable();
                mine == theirs
            });
        let correct = StepPlan::accumulation(t, None);
        Context {
            origin: Origin::Ours,
            steps_per_epoch: Some(crate::plan::sampler::steps_per_epoch(t)),
            eps: t.precision.dtype.epsilon(),
            chaos_possible: t.model.kind.is_deep() && !t.run.lockstep,
            loss: if t.model.kind.token_loss() { Loss::PerToken } else { Loss::PerSample },
            same_samples: Some(same_samples),
            first_short: correct
                .steps
                .iter()
                .position(|s| s.len() < t.shape.acc_steps)
                .map(|i| ShortWindow { step: i, fraction: correct.steps[i].len() as f64 / t.shape.acc_steps as f64 }),
            adam_family: t.optim.optimizer == crate::spec::Optimizer::AdamW,
        }
    }

    /// Two traces a user recorded: what their headers and shapes say.
    pub fn of_traces(a: &Trace, b: &Trace) -> Self {
        let both = [a, b];
        let dtype = a.finals.first().and_then(|(_, t)| t.dtype()).unwrap_or(Dtype::Float32);
        let framework = both.iter().find_map(|t| t.header.framework.filter(|f| super::measure::divides_loss(*f)));
        Context {
            origin: Origin::Recorded { framework },
            eps: dtype.epsilon(),
            steps_per_epoch: both.iter().find_map(|t| t.header.steps_per_epoch),
            chaos_possible: deep(a),
            loss: Loss::PerSample,
            same_samples: None,
            first_short: None,
            adam_family: both.iter().any(|t| t.header.optimizer.is_adam_family()),
        }
    }

    pub fn ours(&self) -> bool {
        self.origin == Origin::Ours
    }

    pub fn framework(&self) -> Option<Framework> {
        match self.origin {
            Origin::Recorded { framework } => framework,
            Origin::Ours => None,
        }
    }
}

/// BatchNorm or many layers: deep enough to amplify rounding from step to step.
fn deep(t: &Trace) -> bool {
    !t.buffers.is_empty() || t.finals.len() > 4
}
