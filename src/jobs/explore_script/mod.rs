//! `ddp-verify explore -- COMMAND`: configurations of a user's own script drawn by
//! proptest, each run as `ddp-verify -- COMMAND` runs it; on the first not equivalent,
//! shrunk to the smallest that still is, printed as a runnable command with its cause, and
//! kept in the regressions file to be replayed first next time.

mod draw;
mod regressions;
mod summary;

pub use draw::Draw;
pub use regressions::{append_line, check_regressions, is_script_line};
pub use summary::suite_case;
use summary::{rerun_command, text, words};

use std::collections::HashMap;
use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::time::Instant;

use proptest::strategy::{Strategy as _, ValueTree as _};
use proptest::test_runner::{Config as RunnerConfig, RngAlgorithm, TestRng, TestRunner};

use super::shrink::shrink;
use crate::error::{Error, Exit, Result};
use crate::judge::{Outcome, Verdict};
use crate::spec::{ScriptExplore, ScriptOptions};

/// Most runs spent shrinking one failure.
const SHRINK_RUNS: usize = 64;

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
    pub draw: Draw,
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
    if x.json {
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

/// Runs the cases one after another and keeps what each showed.
struct Explorer<'a> {
    x: &'a ScriptExplore,
    autoload: PathBuf,
    root: PathBuf,
    started: Instant,
    deadline: Option<Instant>,
    cases: Vec<Case>,
    seen: HashMap<Draw, usize>,
    tty: bool,
}

impl Explorer<'_> {
    fn out_of_time(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    /// One configuration, run once (a draw seen before is not run again); `drawn`: which
    /// draw it is, for the time left.
    fn run(&mut self, draw: &Draw, label: &str, drawn: Option<usize>) -> Result<Case> {
        if let Some(&i) = self.seen.get(draw) {
            return Ok(self.cases[i].clone());
        }
        let dir = self.root.join(format!("case-{}", self.cases.len() + 1));
        let o = ScriptOptions {
            acc_steps: draw.acc_steps,
            gpus: draw.gpus,
            batch_size: draw.batch.unwrap_or(self.x.script.batch_size),
            out: dir.clone(),
            fills: draw.fills(),
            compare: crate::spec::CompareOptions {
                paths: [dir.join(crate::evidence::SAVED_FILES[0]), dir.join(crate::evidence::SAVED_FILES[1])],
                ..self.x.script.compare.clone()
            },
            ..self.x.script.clone()
        };
        if self.tty {
            eprint!("\r\x1b[2Kexplore {label} {}: running", draw.short());
        }
        let t0 = Instant::now();
        let ran = super::script::run_with(&o, &self.autoload);
        let seconds = t0.elapsed().as_secs_f64();
        let (ended, cause) = match ran {
            Ok(Some(outcome)) => ended(&outcome),
            Ok(None) => (Ended::Equivalent, None),
            Err(e @ (Error::Launcher { .. } | Error::BadFlag { .. } | Error::BadFile { .. })) => {
                (Ended::DidNotRun(e.to_string()), None)
            }
            Err(e) => return Err(e),
        };
        let keep = ended != Ended::Equivalent;
        if !keep {
            let _ = std::fs::remove_dir_all(&dir);
        }
        let case = Case { draw: draw.clone(), ended, cause, seconds, dir: keep.then_some(dir) };
        self.seen.insert(draw.clone(), self.cases.len());
        self.cases.push(case.clone());
        if self.tty {
            eprint!("\r\x1b[2K");
        }
        eprintln!("explore {label} {}: {} ({seconds:.1} s{})", draw.short(), words(&case.ended), self.left(drawn));
        Ok(case)
    }

    /// "; about 3.2 min left" while drawing.
    fn left(&self, drawn: Option<usize>) -> String {
        let Some(done) = drawn else { return String::new() };
        let per = self.started.elapsed().as_secs_f64() / self.cases.len().max(1) as f64;
        let mut left = per * self.x.cases.saturating_sub(done) as f64;
        if let Some(d) = self.deadline {
            left = left.min(d.saturating_duration_since(Instant::now()).as_secs_f64());
        }
        match left {
            l if l <= 0.0 => String::new(),
            l if l < 90.0 => format!("; about {l:.0} s left"),
            l => format!("; about {:.1} min left", l / 60.0),
        }
    }
}

fn explore(x: &ScriptExplore) -> Result<Found> {
    // Explore's own time counts from here: finding the recorder is its, not a case's.
    let started = Instant::now();
    let autoload = super::script::autoload_dir(&x.script.launcher.python)?;
    let root = tempfile::Builder::new()
        .prefix("ddp-verify-explore-")
        .tempdir()
        .map_err(|e| Error::io("creating a directory for explore's cases", e))?
        .keep();
    let deadline = x.max_time.and_then(|s| std::time::Duration::try_from_secs_f64(s).ok()).map(|d| started + d);
    let tty = std::io::stderr().is_terminal();
    let mut ex = Explorer { x, autoload, root, started, deadline, cases: Vec::new(), seen: HashMap::new(), tty };
    eprintln!(
        "explore: seed {} (replay with --seed {}); cases' traces and logs under {}",
        x.seed,
        x.seed,
        ex.root.display()
    );

    // The kept failures first: fixed ones pass, the rest fail at once.
    let mut failing: Option<Case> = None;
    let replays: Vec<Draw> =
        regressions::read(&x.regressions, &x.command)?.into_iter().filter(|d| d.gpus <= x.max_gpus).collect();
    for (i, d) in replays.iter().enumerate() {
        let case = ex.run(d, &format!("replay {}/{}", i + 1, replays.len()), None)?;
        if case.ended == Ended::NotEquivalent && failing.is_none() {
            failing = Some(case);
        }
    }

    let mut rng_seed = [0u8; 32];
    rng_seed[..8].copy_from_slice(&x.seed.to_le_bytes());
    let mut runner =
        TestRunner::new_with_rng(RunnerConfig::default(), TestRng::from_seed(RngAlgorithm::ChaCha, &rng_seed));
    let strat = draw::strategy(x.max_gpus, x.takes, &x.axes);
    let (mut drawn, mut shrink_runs, mut stopped) = (0, 0, false);
    let mut tree = None;
    while failing.is_none() && drawn < x.cases {
        if ex.out_of_time() {
            stopped = true;
            break;
        }
        let t = strat.new_tree(&mut runner).map_err(|e| {
            Error::bad_flag("--max-gpus", format!("no configuration could be drawn ({e})"), "raise --max-gpus")
        })?;
        drawn += 1;
        let case = ex.run(&t.current(), &format!("[{drawn}/{}]", x.cases), Some(drawn))?;
        if case.ended == Ended::NotEquivalent {
            failing = Some(case);
            tree = Some(t);
        }
    }
    // proptest's shrinking, each candidate a real run.
    let smallest = match (failing, tree) {
        (Some(_), Some(mut t)) => {
            let before = ex.cases.len();
            let best = shrink(&mut t, SHRINK_RUNS, |d| {
                if ex.out_of_time() {
                    return Ok(false);
                }
                let n = ex.cases.len() - before + 1;
                Ok(ex.run(d, &format!("shrinking {n}"), None)?.ended == Ended::NotEquivalent)
            })?;
            stopped |= ex.out_of_time();
            shrink_runs = ex.cases.len() - before;
            ex.seen.get(&best).map(|&i| ex.cases[i].clone())
        }
        (failing, _) => failing,
    };
    // Only the smallest failure's folder is worth keeping.
    for c in ex.cases.iter_mut() {
        let mine = smallest.as_ref().is_some_and(|s| s.draw == c.draw);
        if let (false, Some(dir), Ended::NotEquivalent) = (mine, &c.dir, &c.ended) {
            let _ = std::fs::remove_dir_all(dir);
            c.dir = None;
        }
    }
    let kept_in = match &smallest {
        Some(s) => regressions::append(&x.regressions, &x.command, &s.draw)?.then(|| x.regressions.clone()),
        None => None,
    };
    let rerun = smallest.as_ref().map(|s| rerun_command(x, &s.draw));
    let seconds = started.elapsed().as_secs_f64();
    let legs: f64 = ex.cases.iter().map(|c| c.seconds).sum();
    if ex.cases.iter().all(|c| c.dir.is_none()) {
        let _ = std::fs::remove_dir_all(&ex.root);
    }
    Ok(Found {
        seed: x.seed,
        command: x.command.clone(),
        replayed: replays.len(),
        drawn,
        shrink_runs,
        cases: ex.cases,
        smallest,
        rerun,
        kept_in,
        seconds,
        own_seconds: (seconds - legs).max(0.0),
        stopped_by_max_time: stopped,
    })
}

/// A judged case's ending and, when not equivalent, its cause in words.
fn ended(o: &Outcome) -> (Ended, Option<String>) {
    match o.verdict() {
        Verdict::Equivalent => (Ended::Equivalent, None),
        Verdict::NoVerdict => (Ended::NoVerdict, None),
        Verdict::NotEquivalent => {
            let d = o.diagnosis.as_ref().or(o.big_batch.as_ref().and_then(|b| b.diagnosis.as_ref()));
            let cause = d.map(|d| match d.where_() {
                Some(w) => format!("{w}: {}", d.detail),
                None => d.detail.clone(),
            });
            (Ended::NotEquivalent, cause)
        }
    }
}
