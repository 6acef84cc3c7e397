//! `ddp-verify suite FILE.toml`: named verifications for a CI gate, run on ranks started
//! once (the largest W any case needs; a case of W ranks runs on ranks 0..W), one
//! verdict per case, summarised in one report.

use std::time::Instant;

use super::pool::RankPool;
use super::verify;
use crate::dist::{world, Collective as _};
use crate::error::{Error, Exit, Result};
use crate::report::suite::{CaseResult, SuiteReport};
pub use crate::spec::{Suite, SuiteCase};

pub fn command(suite: &Suite) -> Result<Exit> {
    if !world::inside_mpi_world() {
        let timeout = std::time::Duration::try_from_secs_f64(suite.timeout_s).unwrap_or(std::time::Duration::MAX);
        return world::relaunch(suite.ranks(), std::env::args_os().skip(1), Some(timeout));
    }
    let rank = world::init_rank()?;
    world::fault_hooks(rank.comm.rank());
    let pool = RankPool::new(rank.world());
    if suite.ranks() > pool.size() {
        return Err(Error::bad_file(
            &suite.file,
            format!("a case needs {} ranks but mpirun started {}", suite.ranks(), pool.size()),
            format!("start mpirun -np {}", suite.ranks()),
        ));
    }
    if !pool.is_leader() {
        rank.fail_all(pool.follow())?;
        return Ok(Exit::Equivalent);
    }
    let report = rank.fail_all(run_cases(suite, &pool))?;
    pool.stop();
    crate::report::suite::write_all(&report, &suite.reports)?;
    Ok(report.exit())
}

/// Rank 0: every case in file order; the other ranks serve them through `pool`.
fn run_cases(suite: &Suite, pool: &RankPool) -> Result<SuiteReport> {
    let started = Instant::now();
    let mut cases = Vec::new();
    for (i, case) in suite.cases.iter().enumerate() {
        let t0 = Instant::now();
        let cfg = &case.config;
        let golden = verify::load_golden(cfg)?;
        let outcome = match verify::repeats(cfg)? {
            Some(why) => crate::judge::Outcome::no_verdict(cfg, why),
            None => {
                let mut runs = pool.both(&cfg.train)?;
                verify::stamp(&cfg.train, &mut runs.accumulation, &mut runs.ddp);
                verify::after(cfg, verify::assemble(cfg, runs.accumulation, runs.ddp, runs.big, golden), false)?
            }
        };
        let result = CaseResult::new(&case.name, &outcome, t0.elapsed().as_secs_f64());
        if suite.progress {
            eprintln!("{}", result.progress_line(i, suite.cases.len()));
        }
        cases.push(result);
    }
    let total = started.elapsed().as_secs_f64();
    Ok(SuiteReport {
        file: suite.file.clone(),
        ranks: pool.size(),
        cases,
        seconds: total,
        start_seconds: world::seconds_since_launch().map(|s| (s - total).max(0.0)),
    })
}
