//! `ddp-verify explore`: configurations drawn by proptest, each run, and the worst shrunk to
//! the smallest that still shows it. Two subjects, one skeleton ([`search`]), in the manner
//! of hyperfine's `Executor`: our own models ([`models`], with libtorch: ranks started once,
//! every planted bug tallied pass by pass) and a user's script ([`script`], every build: each
//! case run as `-- COMMAND` runs it, stopping at the first failure). The skeleton replays the
//! failures the regressions file keeps, seeds proptest's runner from --seed, draws, shrinks
//! within the subject's budget and keeps the failure; a subject says what a case is, how it
//! is drawn and run, and what a run showed.

#[cfg(test)]
mod mock;
#[cfg(feature = "libtorch")]
pub mod models;
mod regressions;
pub mod script;
mod shrink;

pub use regressions::{check_regressions, Line, ScriptLine};
pub use shrink::budget;

use std::path::PathBuf;

use proptest::strategy::{BoxedStrategy, Strategy as _, ValueTree as _};
use proptest::test_runner::{Config as RunnerConfig, RngAlgorithm, TestRng, TestRunner};

use crate::error::{Error, Result};
use crate::spec::Exploration;

/// What explore explores: its cases, how one is drawn and run, and what a run shows.
pub trait Subject {
    /// One configuration: drawn, run, shrunk, kept in the regressions file.
    type Case: Clone + std::fmt::Debug;
    /// What one run of a case showed; shrinking keeps a candidate that shows the same.
    type Finding: Clone + PartialEq;
    /// Most runs spent shrinking one finding (each candidate is a run): one of [`budget`]'s.
    const SHRINK_RUNS: usize;
    /// Random valid cases (proptest's, so they shrink and replay).
    fn strategy(&self) -> BoxedStrategy<Self::Case>;
    /// The cases this subject replays from the regressions file's lines, in file order.
    fn replays(&self, lines: Vec<Line>) -> Vec<Self::Case>;
    /// The ranks a case needs: a regression needing more than --max-gpus is skipped.
    fn gpus(case: &Self::Case) -> usize;
    /// Runs one case (a shrinking run is not one of the cases drawn).
    fn run(&mut self, case: &Self::Case, stage: Stage) -> Result<Self::Finding>;
    /// How much a finding is worth showing and shrinking: 0 not at all; the first of the
    /// most worth is kept.
    fn worth(&self, finding: &Self::Finding) -> u8;
    /// Whether drawing ends at this finding (a script's first failure).
    fn stops(&self, finding: &Self::Finding) -> bool;
    /// The regressions file's line for a failure worth replaying next time, if it is one.
    fn regression(&self, case: &Self::Case, finding: &Self::Finding) -> Option<Line>;
    /// The `ddp-verify` command that checks this one case again.
    fn rerun_command(&self, case: &Self::Case) -> String;
    /// Whether the time given is spent (--max-time): no more draws, no more shrinking.
    fn out_of_time(&self) -> bool {
        false
    }
}

/// Why a case runs: `done` of `of` replays or draws, or a candidate while shrinking.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    Replay { done: usize, of: usize },
    Draw { done: usize, of: usize },
    Shrink,
}

/// What the skeleton did for one subject.
pub struct Explored<C, F> {
    /// Regressions replayed, and those skipped for needing more ranks than --max-gpus.
    pub replayed: usize,
    pub skipped: usize,
    pub drawn: usize,
    pub stopped_by_max_time: bool,
    /// The case most worth showing: replayed, or drawn and shrunk.
    pub worst: Option<Worst<C, F>>,
}

/// A case worth showing and what it showed.
pub struct Worst<C, F> {
    pub case: C,
    pub finding: F,
    /// From the regressions file: not shrunk, and kept there already.
    pub replayed: bool,
    /// The regressions file, where this run appended the case to it.
    pub kept_in: Option<PathBuf>,
    pub rerun: String,
}

/// proptest's runner seeded from --seed as every explore seeds it (ChaCha, the seed's eight
/// bytes little-endian then zeros): the same seed draws the same cases.
pub fn seeded(seed: u64) -> TestRunner {
    let mut rng_seed = [0u8; 32];
    rng_seed[..8].copy_from_slice(&seed.to_le_bytes());
    TestRunner::new_with_rng(RunnerConfig::default(), TestRng::from_seed(RngAlgorithm::ChaCha, &rng_seed))
}

/// The kept failures first (a fixed one passes; one that still fails is the worst, and a
/// subject that stops at a failure draws nothing), then `cases` draws (until the subject
/// stops or its time is spent), then the draw most worth showing shrunk and, if a failure,
/// kept in the regressions file.
pub fn search<S: Subject>(subject: &mut S, x: &Exploration) -> Result<Explored<S::Case, S::Finding>> {
    let (fit, too_big): (Vec<_>, Vec<_>) =
        subject.replays(regressions::read(&x.regressions)?).into_iter().partition(|c| S::gpus(c) <= x.max_gpus);
    let mut worst = None;
    for (i, case) in fit.iter().enumerate() {
        let finding = subject.run(case, Stage::Replay { done: i + 1, of: fit.len() })?;
        if worst.is_none() && subject.worth(&finding) > 0 {
            let rerun = subject.rerun_command(case);
            worst = Some(Worst { case: case.clone(), finding, replayed: true, kept_in: None, rerun });
        }
    }
    let mut explored =
        Explored { replayed: fit.len(), skipped: too_big.len(), drawn: 0, stopped_by_max_time: false, worst };
    if explored.worst.as_ref().is_some_and(|w| subject.stops(&w.finding)) {
        return Ok(explored);
    }
    let strategy = subject.strategy();
    let mut runner = seeded(x.seed);
    // The tree most worth shrinking and what it showed.
    let mut best = None;
    while explored.drawn < x.cases {
        if subject.out_of_time() {
            explored.stopped_by_max_time = true;
            break;
        }
        let tree = strategy.new_tree(&mut runner).map_err(|e| {
            Error::bad_flag("--max-gpus", format!("no valid configuration could be drawn ({e})"), "raise --max-gpus")
        })?;
        explored.drawn += 1;
        let finding = subject.run(&tree.current(), Stage::Draw { done: explored.drawn, of: x.cases })?;
        let stops = subject.stops(&finding);
        if subject.worth(&finding) > best.as_ref().map_or(0, |(_, f)| subject.worth(f)) {
            best = Some((tree, finding));
        }
        if stops {
            break;
        }
    }
    let Some((mut tree, finding)) = best.filter(|_| explored.worst.is_none()) else { return Ok(explored) };
    let case = shrink::shrink(&mut tree, S::SHRINK_RUNS, |c| {
        Ok(!subject.out_of_time() && subject.run(c, Stage::Shrink)? == finding)
    })?;
    explored.stopped_by_max_time |= subject.out_of_time();
    let kept_in = match subject.regression(&case, &finding) {
        Some(line) => regressions::append(&x.regressions, &line)?.then(|| x.regressions.clone()),
        None => None,
    };
    let rerun = subject.rerun_command(&case);
    explored.worst = Some(Worst { case, finding, replayed: false, kept_in, rerun });
    Ok(explored)
}
