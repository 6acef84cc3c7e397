//! `ddp-verify explore`: random configurations through both runs on ranks started once,
//! each failure shrunk by proptest to a minimal reproducing command, and planted bugs
//! tallied against the configurations they can change.

mod regressions;
mod runner;
mod strategy;
mod summary;

use regressions::append_regression;
pub use regressions::read_regressions;
use runner::{classify, Case, Finding, Runner};
pub use strategy::{amp_strategy, linear_strategy, optim_strategy, plant, resnet_strategy, strategy, tiny_lm_strategy};

use std::collections::BTreeMap;
use std::io::Write as _;
use std::time::Instant;

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config as RunnerConfig, RngAlgorithm, TestRng, TestRunner};

use super::pool::RankPool;
use super::shrink::shrink;
use crate::dist::{world as launch, Collective as _};
use crate::error::{Error, Exit, Result};
use crate::judge::{Agreement, Diagnosis};
pub use crate::spec::ExploreOptions;
use crate::spec::{Bug, ModelKind, TrainConfig};

/// What one bug (or the honest run) did over all cases.
#[derive(Debug, Default, serde::Serialize)]
pub struct Tally {
    pub bug: Option<Bug>,
    pub cases: usize,
    pub replayed: usize,
    /// Regressions that need more ranks than --max-gpus started.
    pub skipped_regressions: usize,
    pub not_equivalent: usize,
    /// Honest draws whose training blew up (NaN or Inf in both runs): nothing can be proven
    /// from them, so they count neither way.
    pub blew_up: usize,
    /// Draws whose kernels gave other bits for the same micro-batch (`train::repeat_check`):
    /// no verdict, never a pass nor a false alarm.
    pub no_verdict: usize,
    /// Draws under a float16 loss scaler whose every step was skipped by both runs or left
    /// unjudged by float16's range: nothing judged, so they count neither way.
    pub unjudged: usize,
    /// Cases of a ResNet among `cases`.
    pub resnet_cases: usize,
    /// Honest runs: the largest fraction of its allowance any case used (under 1 passes).
    pub max_used: f64,
    /// Planted bugs: the smallest factor by which a caught case exceeded its allowance.
    pub min_margin: Option<f64>,
    pub reasons: BTreeMap<&'static str, usize>,
    pub changes_math: usize,
    /// Configurations the bug only reorders (the same sums, other rounding), and on how
    /// many of them the gate fired anyway.
    pub reordered: usize,
    pub reordered_fired: usize,
    pub caught: usize,
    pub missed: usize,
    pub false_alarms: usize,
    /// The shrunk case worth showing: a failure, a miss or false alarm, or else the
    /// smallest config the bug was caught on.
    pub example: Option<Example>,
}

#[derive(Debug, serde::Serialize)]
pub struct Example {
    pub what: &'static str,
    pub config: TrainConfig,
    pub diagnosis: Option<Diagnosis>,
}

#[derive(Debug, Default, serde::Serialize)]
pub struct Timing {
    pub total: f64,
    pub start: Option<f64>,
    pub ddp: f64,
    pub comm: f64,
    pub accumulation: f64,
    pub compare: f64,
    pub evaluations: usize,
}

/// What explore found; `--json` prints it as it is.
#[derive(serde::Serialize)]
pub struct ExploreReport {
    pub seed: u64,
    pub cases: usize,
    pub max_gpus: usize,
    /// The models configurations are drawn for (linear, resnet-tiny).
    pub models: Vec<ModelKind>,
    pub tallies: Vec<Tally>,
    pub timing: Timing,
}

/// `ddp-verify explore`: outside an MPI world, starts `max_gpus` ranks once by running this
/// same command again under mpirun; inside one, rank 0 explores and prints while the other
/// ranks serve its jobs. Returns the exit code.
pub fn command(opts: &ExploreOptions) -> Result<Exit> {
    if !launch::inside_mpi_world() {
        return launch::relaunch(opts.max_gpus, std::env::args_os().skip(1), None);
    }
    let rank = launch::init_rank()?;
    launch::fault_hooks(rank.comm.rank());
    let pool = RankPool::new(rank.world());
    if opts.max_gpus > pool.size() {
        return Err(Error::bad_flag(
            "--max-gpus",
            format!("{} ranks are needed but mpirun started {}", opts.max_gpus, pool.size()),
            format!("pass --max-gpus {} or start mpirun -np {}", pool.size(), opts.max_gpus),
        ));
    }
    if !pool.is_leader() {
        // A rank that fails stops every rank at once, instead of leaving rank 0 waiting.
        rank.fail_all(pool.follow())?;
        return Ok(Exit::Equivalent);
    }
    let report = rank.fail_all(explore(opts, &pool))?;
    pool.stop();
    if opts.json {
        println!("{}", serde_json::to_string_pretty(&report).expect("the report serialises"));
    } else {
        print!("{}", report.to_text());
    }
    Ok(match (report.passed(), report.tallies.iter().any(|t| t.no_verdict > 0)) {
        (false, _) => Exit::NotEquivalent,
        (true, true) => Exit::NoVerdict,
        (true, false) => Exit::Equivalent,
    })
}

/// Rank 0's side of explore; the other ranks run `pool.follow()`.
pub fn explore(opts: &ExploreOptions, pool: &RankPool) -> Result<ExploreReport> {
    let started = Instant::now();
    let mut runner = Runner { pool, kernels: opts.kernels, tol: opts.tolerance, timing: Timing::default() };
    let mut tallies = Vec::new();
    for (pass, &bug) in opts.bugs.iter().enumerate() {
        // Each bug on the drawn models that can carry it; none, no pass.
        let models: Vec<ModelKind> =
            opts.models.iter().copied().filter(|&m| bug.is_none_or(|b| b.applies_to(m))).collect();
        if models.is_empty() {
            continue;
        }
        let strat = strategy(opts.max_gpus, &models);
        tallies.push(explore_one(opts, &mut runner, &strat, bug, pass)?);
    }
    let mut timing = runner.timing;
    timing.total = started.elapsed().as_secs_f64();
    timing.start = launch::seconds_since_launch().map(|s| (s - timing.total).max(0.0));
    timing.comm = pool.comm_seconds();
    if opts.progress {
        eprint!("\r{:60}\r", "");
    }
    Ok(ExploreReport {
        seed: opts.seed,
        cases: opts.cases,
        max_gpus: opts.max_gpus,
        models: opts.models.clone(),
        tallies,
        timing,
    })
}

fn explore_one<S: Strategy<Value = TrainConfig>>(
    opts: &ExploreOptions,
    runner: &mut Runner,
    strat: &S,
    bug: Option<Bug>,
    pass: usize,
) -> Result<Tally> {
    let mut tally = Tally { bug, ..Tally::default() };
    let record = |tally: &mut Tally, cfg: &TrainConfig, case: &Case| {
        let outcome = classify(bug, cfg, case);
        tally.cases += 1;
        tally.resnet_cases += usize::from(cfg.model.kind.is_resnet());
        if outcome == Finding::BlewUp {
            tally.blew_up += 1;
            return outcome;
        }
        if outcome == Finding::NoVerdict {
            tally.no_verdict += 1;
            return outcome;
        }
        if outcome == Finding::Unjudged {
            tally.unjudged += 1;
            return outcome;
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
        outcome
    };

    if bug.is_none() {
        let (fit, too_big): (Vec<_>, Vec<_>) =
            read_regressions(opts.regressions.as_ref())?.into_iter().partition(|c| c.shape.gpus <= opts.max_gpus);
        tally.skipped_regressions = too_big.len();
        for cfg in fit {
            let case = runner.evaluate(&cfg)?;
            tally.replayed += 1;
            if record(&mut tally, &cfg, &case) == Finding::Failure && tally.example.is_none() {
                tally.example = Some(Example { what: "replayed failure", config: cfg, diagnosis: case.diagnosis });
            }
        }
    }

    let mut rng_seed = [0u8; 32];
    rng_seed[..8].copy_from_slice(&opts.seed.to_le_bytes());
    let mut test_runner =
        TestRunner::new_with_rng(RunnerConfig::default(), TestRng::from_seed(RngAlgorithm::ChaCha, &rng_seed));
    // The tree to shrink and what it showed; a problem outranks a plain catch.
    let mut keep: Option<(S::Tree, Finding)> = None;
    for i in 0..opts.cases {
        let tree = strat.new_tree(&mut test_runner).map_err(|e| {
            Error::bad_flag("--max-gpus", format!("no valid configuration could be drawn ({e})"), "raise --max-gpus")
        })?;
        let mut cfg = tree.current();
        plant(&mut cfg, bug);
        let case = runner.evaluate(&cfg)?;
        let outcome = record(&mut tally, &cfg, &case);
        let rank = |o: Finding| match o {
            Finding::Fine | Finding::BlewUp | Finding::Unjudged | Finding::Reordered | Finding::NoVerdict => 0,
            Finding::Caught => 1,
            _ => 2,
        };
        if rank(outcome) > keep.as_ref().map_or(0, |(_, o)| rank(*o)) {
            keep = Some((tree, outcome));
        }
        if opts.progress {
            progress(pass, bug, i + 1, opts.cases, tally.not_equivalent);
        }
    }
    if let Some((mut tree, outcome)) = keep {
        if tally.example.is_none() {
            let config = shrink(&mut tree, 512, |c| {
                let mut c = c.clone();
                plant(&mut c, bug);
                Ok(classify(bug, &c, &runner.evaluate(&c)?) == outcome)
            })?;
            let mut config = config;
            plant(&mut config, bug);
            let diagnosis = runner.evaluate(&config)?.diagnosis;
            if outcome == Finding::Failure {
                append_regression(opts.regressions.as_ref(), &config)?;
            }
            let what = match outcome {
                Finding::Failure => "not equivalent",
                Finding::Caught => "smallest config caught",
                Finding::Missed => "MISSED",
                _ => "FALSE ALARM",
            };
            tally.example = Some(Example { what, config, diagnosis });
        }
    }
    Ok(tally)
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
