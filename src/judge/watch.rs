//! One run judged by each stage's contract (`ddp-verify watch`): no second training, no
//! reference. Each contract is what makes W ranks with K/W micro-batches each equal one
//! process accumulating K (`docs/watch.md`); the first step that breaks one is named by the
//! one diagnosis pipeline, with its stage and owner. What the run did not record is said as
//! not checked, never as held.

use serde::Serialize;

use super::diagnose::{contracts, scales_inside, Diagnosis, Stage};
use super::{Comparer, Verdict};
use crate::evidence::Trace;
use crate::spec::Tolerance;

/// Whether a contract was checked over the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Held {
    Held,
    Broken,
    /// The run did not record the facts it needs (the reason beside it).
    NotChecked,
}

/// One stage's contract over the run.
#[derive(Debug, Clone, Serialize)]
pub struct Contract {
    pub stage: Stage,
    /// What it holds the run to, in words.
    pub says: &'static str,
    pub held: Held,
    /// Why it was not checked, where it was not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unchecked: Option<&'static str>,
}

/// What `watch` hands the report.
pub struct Watched {
    pub trace: Trace,
    /// Optimizer steps the run made and judged.
    pub steps: usize,
    pub world: usize,
    /// The first step that broke a contract, named (its `step`), or None.
    pub fault: Option<Diagnosis>,
    pub contracts: Vec<Contract>,
    /// What ddp-verify did around the run (a run stopped at its fault, a hang after its
    /// trace), said beside the verdict.
    pub notes: Vec<String>,
}

impl Watched {
    /// Broken: not equivalent; nothing checked at all: no verdict; else every checked
    /// contract held.
    pub fn verdict(&self) -> Verdict {
        match (&self.fault, self.contracts.iter().any(|c| c.held == Held::Held)) {
            (Some(_), _) => Verdict::NotEquivalent,
            (None, true) => Verdict::Equivalent,
            (None, false) => Verdict::NoVerdict,
        }
    }

    pub fn exit(&self) -> crate::error::Exit {
        self.verdict().exit()
    }
}

/// `t`, one run's trace, judged by its contracts.
pub fn watch(t: Trace, notes: Vec<String>) -> Watched {
    let c = Comparer::new("the contract", "this run", &Tolerance::default(), None).finish(&t, &t, false);
    let fault = contracts(&t, &c);
    let checked = checkable(&t);
    let contracts = checked
        .into_iter()
        .map(|(stage, says, unchecked)| {
            let broken = fault.as_ref().and_then(|d| d.located.as_ref()).is_some_and(|l| l.stage == stage);
            let held = match (broken, unchecked) {
                (true, _) => Held::Broken,
                (false, None) => Held::Held,
                (false, Some(_)) => Held::NotChecked,
            };
            Contract { stage, says, held, unchecked: unchecked.filter(|_| !broken) }
        })
        .collect();
    Watched {
        steps: t.steps.len().max(t.facts.stages.len()).saturating_add(t.header.first_step.unwrap_or(0)),
        world: t.header.world_size.unwrap_or(1),
        fault,
        contracts,
        notes,
        trace: t,
    }
}

/// Each stage's contract, and why the run's facts cannot check it, where they cannot.
fn checkable(t: &Trace) -> Vec<(Stage, &'static str, Option<&'static str>)> {
    let stages = &t.facts.stages;
    let world = t.header.world_size.unwrap_or(1);
    let batches = stages.iter().any(|s| !s.batches.is_empty());
    let hashed = stages.iter().flat_map(|s| &s.batches).any(|b| b.rows.is_some());
    let normalised = stages.iter().flat_map(|s| &s.batches).any(|b| b.normaliser.is_some());
    let scaled = stages.iter().flat_map(|s| &s.batches).any(|b| b.scaling().is_some());
    let inside = scales_inside(t);
    let mean = t.header.loss_is_mean();
    let local = stages.iter().any(|s| !s.local.is_empty());
    let planned = t.header.planned_steps.is_some();
    // A recorder that writes `loss_dtype` writes each micro-batch's autocast wherever a
    // forward ran under one: none written there is every rank off.
    let precision =
        t.header.loss_dtype.is_some() || stages.iter().flat_map(|s| &s.batches).any(|b| b.autocast.is_some());
    let none = "the run recorded no stage facts (a recorder older than this check, or no backward seen)";
    let why = |ok: bool, reason: &'static str| if !batches { Some(none) } else { (!ok).then_some(reason) };
    vec![
        (
            Stage::Precision,
            "every rank runs its forwards at one precision (autocast's dtype, or off)",
            why(
                world > 1 && precision,
                if world > 1 {
                    "no micro-batch's autocast was recorded (a recorder older than this check)"
                } else {
                    "one process: no ranks to compare"
                },
            ),
        ),
        (
            Stage::Samples,
            "the ranks' micro-batches in a step are different samples, and the steps a framework planned reach \
             each epoch's every batch",
            why(
                (world > 1 && hashed) || planned,
                if world > 1 { "no sample was hashed" } else { "one process: no ranks to deal" },
            ),
        ),
        (
            Stage::Loss,
            "a normaliser weighs every item of the window alike on every rank",
            why(normalised, "no forward was passed num_items_in_batch"),
        ),
        (
            Stage::Scaling,
            "what backward ran on, over the reduction's divide, weighs every micro-batch 1/K (an epoch's short last window's: 1 over what it holds)",
            why(
                scaled && !inside && (mean || normalised),
                if !scaled {
                    "no loss and root of backward were recorded"
                } else if inside {
                    "DeepSpeed's engine divides inside its backward, out of the recorded roots' sight"
                } else {
                    "the loss is no mean over its micro-batch (a sum over a count of the script's own, or a sum of \
                     losses): one run cannot tell what it should be scaled by; only that every rank scales alike"
                },
            ),
        ),
        (Stage::LocalGradient, "nothing zeroes or drops a micro-batch's gradient inside the window", why(true, "")),
        (
            Stage::Reduction,
            "the applied gradient is the mean of the ranks' local gradients, and the ranks apply one gradient",
            why(
                local,
                if world > 1 { "no local gradient sums were recorded" } else { "one process: nothing is reduced" },
            ),
        ),
        (
            Stage::Update,
            "the optimizer steps once per window, and every rank holds the same weights after each step",
            why(true, ""),
        ),
    ]
}
