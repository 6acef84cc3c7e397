//! `ddp-verify explore -- COMMAND`: configurations of a user's own script drawn by
//! proptest, each run as `ddp-verify -- COMMAND` runs it; on the first not equivalent,
//! shrunk to the smallest that still is, printed as a runnable command with its cause, and
//! kept in the regressions file to be replayed first next time.

mod cases;
mod draw;
mod summary;

pub use summary::suite_case;

use std::path::PathBuf;
use std::time::Instant;

use cases::Explorer;
use summary::text;

use crate::error::{Error, Exit, Result};
use crate::spec::ScriptExplore;

/// How one configuration ended.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Ended {
    Equivalent,
    NotEquivalent,
    NoVerdict,
    /// A leg failed, or the script refused the configuration (its words).
    DidNotRun(String),
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Case {
    pub draw: crate::spec::Draw,
    pub ended: Ended,
    /// Where the runs part and why, when not equivalent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cause: Option<String>,
    /// The legs' run and judging, in seconds.
    pub seconds: f64,
    /// Its traces and logs (kept for a failure only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dir: Option<PathBuf>,
}

/// What explore found; `--json` prints it as it is.
#[derive(serde::Serialize)]
pub struct Found {
    pub seed: u64,
    pub command: Vec<String>,
    pub replayed: usize,
    pub drawn: usize,
    pub shrink_runs: usize,
    /// Every case run, in order (replays, draws, then the shrinking's).
    pub cases: Vec<Case>,
    /// The smallest not-equivalent configuration, and its command.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub smallest: Option<Case>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rerun: Option<String>,
    pub kept_in: Option<PathBuf>,
    pub seconds: f64,
    /// Explore's own time, beyond its cases' runs: drawing, shrinking, files, printing.
    pub own_seconds: f64,
    pub stopped_by_max_time: bool,
}

pub fn command(x: &ScriptExplore) -> Result<Exit> {
    let found = explore(x)?;
    if x.exploration.json {
        println!("{}", serde_json::to_string_pretty(&found).expect("the report serialises"));
    } else {
        print!("{}", text(&found));
    }
    let any = |f: &dyn Fn(&Ended) -> bool| found.cases.iter().any(|c| f(&c.ended));
    Ok(match () {
        _ if found.smallest.is_some() => Exit::NotEquivalent,
        _ if any(&|e| matches!(e, Ended::DidNotRun(_))) => Exit::Failed,
        _ if any(&|e| *e == Ended::NoVerdict) => Exit::NoVerdict,
        _ => Exit::Equivalent,
    })
}

fn explore(x: &ScriptExplore) -> Result<Found> {
    // Explore's own time counts from here: finding the recorder is its, not a case's.
    let started = Instant::now();
    let autoload = crate::jobs::script::autoload_dir(&x.script.launcher.python)?;
    let root = tempfile::Builder::new()
        .prefix("ddp-verify-explore-")
        .tempdir()
        .map_err(|e| Error::io("creating a directory for explore's cases", e))?
        .keep();
    let mut ex = Explorer::new(x, autoload, root, started);
    eprintln!(
        "explore: seed {} (replay with --seed {}); cases' traces and logs under {}",
        x.exploration.seed,
        x.exploration.seed,
        ex.root.display()
    );
    let explored = super::search(&mut ex, &x.exploration)?;
    let smallest = explored.worst.as_ref().and_then(|w| ex.case(&w.case));
    // Only the smallest failure's folder is worth keeping.
    for c in ex.cases.iter_mut() {
        let mine = smallest.as_ref().is_some_and(|s| s.draw == c.draw);
        if let (false, Some(dir), Ended::NotEquivalent) = (mine, &c.dir, &c.ended) {
            let _ = std::fs::remove_dir_all(dir);
            c.dir = None;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let legs: f64 = ex.cases.iter().map(|c| c.seconds).sum();
    if ex.cases.iter().all(|c| c.dir.is_none()) {
        let _ = std::fs::remove_dir_all(&ex.root);
    }
    let (kept_in, rerun) = explored.worst.map_or((None, None), |w| (w.kept_in, Some(w.rerun)));
    Ok(Found {
        seed: x.exploration.seed,
        command: x.command.clone(),
        replayed: explored.replayed,
        drawn: explored.drawn,
        shrink_runs: ex.shrink_runs(),
        cases: ex.cases,
        smallest,
        rerun,
        kept_in,
        seconds,
        own_seconds: (seconds - legs).max(0.0),
        stopped_by_max_time: explored.stopped_by_max_time,
    })
}
