//! `ddp-verify explore` on our own models: random configurations through both runs on
//! ranks started once, one pass per planted bug (the first, with none, the honest run), each
//! pass's cases tallied and its worst shrunk to a minimal reproducing command.

mod pass;
mod runner;
mod strategy;
mod summary;

pub use strategy::{amp_strategy, linear_strategy, optim_strategy, plant, resnet_strategy, strategy, tiny_lm_strategy};

use std::collections::BTreeMap;
use std::time::Instant;

use pass::Pass;
use runner::Runner;

use super::search;
use crate::dist::{world as launch, Collective as _};
use crate::error::{Error, Exit, Result};
use crate::jobs::pool::RankPool;
use crate::judge::Diagnosis;
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
    let max_gpus = opts.exploration.max_gpus;
    if !launch::inside_mpi_world() {
        return launch::relaunch(max_gpus, std::env::args_os().skip(1), None);
    }
    let rank = launch::init_rank()?;
    launch::fault_hooks(rank.comm.rank());
    let pool = RankPool::new(rank.world());
    if max_gpus > pool.size() {
        return Err(Error::bad_flag(
            "--max-gpus",
            format!("{} ranks are needed but mpirun started {}", max_gpus, pool.size()),
            format!("pass --max-gpus {} or start mpirun -np {}", pool.size(), max_gpus),
        ));
    }
    if !pool.is_leader() {
        // A rank that fails stops every rank at once, instead of leaving rank 0 waiting.
        rank.fail_all(pool.follow())?;
        return Ok(Exit::Equivalent);
    }
    let report = rank.fail_all(explore(opts, &pool))?;
    pool.stop();
    if opts.exploration.json {
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
    for (number, &bug) in opts.bugs.iter().enumerate() {
        // Each bug on the drawn models that can carry it; none, no pass.
        let models: Vec<ModelKind> =
            opts.models.iter().copied().filter(|&m| bug.is_none_or(|b| b.applies_to(m))).collect();
        if models.is_empty() {
            continue;
        }
        let mut pass = Pass::new(opts, &mut runner, models, bug, number);
        let explored = search(&mut pass, &opts.exploration)?;
        tallies.push(pass.tally(explored)?);
    }
    let mut timing = runner.timing;
    timing.total = started.elapsed().as_secs_f64();
    timing.start = launch::seconds_since_launch().map(|s| (s - timing.total).max(0.0));
    timing.comm = pool.comm_seconds();
    if opts.progress {
        eprint!("\r{:60}\r", "");
    }
    let x = &opts.exploration;
    Ok(ExploreReport {
        seed: x.seed,
        cases: x.cases,
        max_gpus: x.max_gpus,
        models: opts.models.clone(),
        tallies,
        timing,
    })
}
