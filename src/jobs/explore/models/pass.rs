//! One pass of explore over our models as the skeleton's subject: the pass's bug planted in
//! every draw (none: the honest run, which alone replays the kept failures), every case
//! tallied as it runs, and the worst, shrunk, run once more for its diagnosis.

use std::io::Write as _;

use proptest::strategy::{BoxedStrategy, Strategy as _};

use super::runner::{classify, Case, Finding, Runner};
use super::{plant, strategy, Example, Tally};
use crate::error::Result;
use crate::jobs::explore::{budget, Explored, Line, Stage, Subject};
use crate::judge::Agreement;
use crate::spec::{Bug, ExploreOptions, ModelKind, TrainConfig};

pub(super) struct Pass<'a, 'r> {
    opts: &'a ExploreOptions,
    runner: &'a mut Runner<'r>,
    /// The models drawn: those that can carry the bug.
    models: Vec<ModelKind>,
    bug: Option<Bug>,
    /// Which pass this is, from 0, for the progress bar.
    number: usize,
    tally: Tally,
}

impl<'a, 'r> Pass<'a, 'r> {
    pub(super) fn new(
        opts: &'a ExploreOptions,
        runner: &'a mut Runner<'r>,
        models: Vec<ModelKind>,
        bug: Option<Bug>,
        number: usize,
    ) -> Self {
        Pass { opts, runner, models, bug, number, tally: Tally { bug, ..Tally::default() } }
    }

    /// The pass's tally, with the case most worth showing: a replayed failure as it ran, a
    /// drawn one shrunk and run again for its diagnosis.
    pub(super) fn tally(mut self, explored: Explored<TrainConfig, Finding>) -> Result<Tally> {
        self.tally.skipped_regressions = explored.skipped;
        if let Some(worst) = explored.worst.filter(|w| !w.replayed) {
            let diagnosis = self.runner.evaluate(&worst.case)?.diagnosis;
            let what = match worst.finding {
                Finding::Failure => "not equivalent",
                Finding::Caught => "smallest config caught",
                Finding::Missed => "MISSED",
                _ => "FALSE ALARM",
            };
            self.tally.example = Some(Example { what, config: worst.case, diagnosis });
        }
        Ok(self.tally)
    }

    /// Counts one case (a replay or a draw) in the tally.
    fn record(&mut self, cfg: &TrainConfig, case: &Case, outcome: Finding) {
        let (tally, bug) = (&mut self.tally, self.bug);
        tally.cases += 1;
        tally.resnet_cases += usize::from(cfg.model.kind.is_resnet());
        // Counted apart, neither way.
        let apart = match outcome {
            Finding::BlewUp => Some(&mut tally.blew_up),
            Finding::NoVerdict => Some(&mut tally.no_verdict),
            Finding::Unjudged => Some(&mut tally.unjudged),
            _ => None,
        };
        if let Some(n) = apart {
            *n += 1;
            return;
        }
        if bug.is_none() {
            tally.max_used = tally.max_used.max(case.used);
        }
        if case.verdict == Agreement::Diverged {
            tally.not_equivalent += 1;
            let reason = case.diagnosis.as_ref().map_or("unexplained", |d| d.reason.name());
            *tally.reasons.entry(reason).or_default() += 1;
        }
        if let Some(b) = bug {
            tally.changes_math += usize::from(crate::plan::bugs::changes_math(b, cfg));
        }
        match outcome {
            Finding::Caught => {
                tally.caught += 1;
                tally.min_margin = Some(tally.min_margin.map_or(case.used, |m| m.min(case.used)));
            }
            Finding::Missed => tally.missed += 1,
            Finding::FalseAlarm => tally.false_alarms += 1,
            Finding::Reordered => {
                tally.reordered += 1;
                tally.reordered_fired += usize::from(case.verdict == Agreement::Diverged);
            }
            _ => {}
        }
    }
}

/// Our models' passes draw every case, tally them all, and shrink the worst.
impl Subject for Pass<'_, '_> {
    type Case = TrainConfig;
    type Finding = Finding;
    const SHRINK_RUNS: usize = budget::OUR_MODELS;

    /// The models' configurations with the pass's bug planted.
    fn strategy(&self) -> BoxedStrategy<TrainConfig> {
        let bug = self.bug;
        let planted = move |mut c: TrainConfig| {
            plant(&mut c, bug);
            c
        };
        strategy(self.opts.exploration.max_gpus, &self.models).prop_map(planted).boxed()
    }

    /// The honest pass replays our models' configurations that today's rules take.
    fn replays(&self, lines: Vec<Line>) -> Vec<TrainConfig> {
        let ours = |l: Line| match l {
            Line::Config(c) if crate::plan::checks::check_train(&c).is_ok() => Some(*c),
            _ => None,
        };
        match self.bug {
            None => lines.into_iter().filter_map(ours).collect(),
            Some(_) => Vec::new(),
        }
    }

    fn gpus(cfg: &TrainConfig) -> usize {
        cfg.shape.gpus
    }

    fn run(&mut self, cfg: &TrainConfig, stage: Stage) -> Result<Finding> {
        let case = self.runner.evaluate(cfg)?;
        let outcome = classify(self.bug, cfg, &case);
        match stage {
            Stage::Shrink => return Ok(outcome),
            Stage::Replay { .. } => {
                self.tally.replayed += 1;
                self.record(cfg, &case, outcome);
                if outcome == Finding::Failure && self.tally.example.is_none() {
                    let (config, diagnosis) = (cfg.clone(), case.diagnosis);
                    self.tally.example = Some(Example { what: "replayed failure", config, diagnosis });
                }
            }
            Stage::Draw { done, of } => {
                self.record(cfg, &case, outcome);
                if self.opts.progress {
                    progress(self.number, self.bug, done, of, self.tally.not_equivalent);
                }
            }
        }
        Ok(outcome)
    }

    /// A problem (a failure, a miss, a false alarm) outranks a plain catch.
    fn worth(&self, outcome: &Finding) -> u8 {
        match outcome {
            Finding::Fine | Finding::BlewUp | Finding::Unjudged | Finding::Reordered | Finding::NoVerdict => 0,
            Finding::Caught => 1,
            Finding::Failure | Finding::Missed | Finding::FalseAlarm => 2,
        }
    }

    fn stops(&self, _: &Finding) -> bool {
        false
    }

    /// An honest run not equivalent is kept; a planted bug's findings are about the gate.
    fn regression(&self, cfg: &TrainConfig, outcome: &Finding) -> Option<Line> {
        (*outcome == Finding::Failure).then(|| Line::Config(Box::new(cfg.clone())))
    }

    fn rerun_command(&self, cfg: &TrainConfig) -> String {
        cfg.command()
    }
}

/// A one-line bar on stderr, redrawn in place (only when the launcher saw a terminal).
fn progress(pass: usize, bug: Option<Bug>, done: usize, total: usize, failed: usize) {
    const WIDTH: usize = 30;
    let filled = WIDTH * done / total.max(1);
    let label = bug.map_or("honest runs", Bug::name);
    eprint!(
        "\r[{}{}] {done}/{total} pass {} ({label}), {failed} not equivalent   ",
        "#".repeat(filled),
        ".".repeat(WIDTH - filled),
        pass + 1
    );
    let _ = std::io::stderr().flush();
}
