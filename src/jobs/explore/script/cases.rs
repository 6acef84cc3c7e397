//! A user's script as explore's subject: each case run as `ddp-verify -- COMMAND` runs it
//! (a draw seen before is not run again), a line on stderr as it ends, and every case kept
//! for the report.

use std::collections::HashMap;
use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::time::Instant;

use proptest::strategy::{BoxedStrategy, Strategy as _};

use super::summary::{rerun_command, words};
use super::{Case, Ended};
use crate::error::{Error, Result};
use crate::jobs::explore::{budget, Line, ScriptLine, Stage, Subject};
use crate::judge::{Outcome, Verdict};
use crate::spec::{Draw, ScriptExplore, ScriptOptions};

/// Runs the cases one after another and keeps what each showed.
pub(super) struct Explorer<'a> {
    x: &'a ScriptExplore,
    autoload: PathBuf,
    pub(super) root: PathBuf,
    started: Instant,
    deadline: Option<Instant>,
    pub(super) cases: Vec<Case>,
    seen: HashMap<Draw, usize>,
    tty: bool,
    /// How many cases had run when shrinking began.
    shrink_from: Option<usize>,
}

impl<'a> Explorer<'a> {
    pub(super) fn new(x: &'a ScriptExplore, autoload: PathBuf, root: PathBuf, started: Instant) -> Self {
        let deadline = x.max_time.and_then(|s| std::time::Duration::try_from_secs_f64(s).ok()).map(|d| started + d);
        let tty = std::io::stderr().is_terminal();
        Explorer {
            x,
            autoload,
            root,
            started,
            deadline,
            cases: Vec::new(),
            seen: HashMap::new(),
            tty,
            shrink_from: None,
        }
    }

    /// The case run for `draw`, if it ran.
    pub(super) fn case(&self, draw: &Draw) -> Option<Case> {
        self.seen.get(draw).map(|&i| self.cases[i].clone())
    }

    /// The cases shrinking ran (a draw seen before is not run again).
    pub(super) fn shrink_runs(&self) -> usize {
        self.shrink_from.map_or(0, |from| self.cases.len() - from)
    }

    /// One configuration, run once; `drawn`: which draw it is, for the time left.
    fn run_once(&mut self, draw: &Draw, label: &str, drawn: Option<usize>) -> Result<Case> {
        if let Some(case) = self.case(draw) {
            return Ok(case);
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
        let ran = crate::jobs::script::run_with(&o, &self.autoload);
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
        let mut left = per * self.x.exploration.cases.saturating_sub(done) as f64;
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

/// A script's cases stop at the first not equivalent, which is shrunk and kept.
impl Subject for Explorer<'_> {
    type Case = Draw;
    type Finding = Ended;
    const SHRINK_RUNS: usize = budget::A_SCRIPT;

    fn strategy(&self) -> BoxedStrategy<Draw> {
        super::draw::strategy(self.x.exploration.max_gpus, self.x.takes, &self.x.axes).boxed()
    }

    /// This command's lines (the same words, placeholders and all).
    fn replays(&self, lines: Vec<Line>) -> Vec<Draw> {
        let mine = |l: Line| match l {
            Line::Script(s) if s.command == self.x.command => Some(s.draw),
            _ => None,
        };
        lines.into_iter().filter_map(mine).collect()
    }

    fn gpus(draw: &Draw) -> usize {
        draw.gpus
    }

    fn run(&mut self, draw: &Draw, stage: Stage) -> Result<Ended> {
        let (label, drawn) = match stage {
            Stage::Replay { done, of } => (format!("replay {done}/{of}"), None),
            Stage::Draw { done, of } => (format!("[{done}/{of}]"), Some(done)),
            Stage::Shrink => {
                let from = *self.shrink_from.get_or_insert(self.cases.len());
                (format!("shrinking {}", self.cases.len() - from + 1), None)
            }
        };
        Ok(self.run_once(draw, &label, drawn)?.ended)
    }

    fn worth(&self, ended: &Ended) -> u8 {
        u8::from(*ended == Ended::NotEquivalent)
    }

    fn stops(&self, ended: &Ended) -> bool {
        *ended == Ended::NotEquivalent
    }

    fn regression(&self, draw: &Draw, ended: &Ended) -> Option<Line> {
        let line = ScriptLine { command: self.x.command.clone(), draw: draw.clone() };
        (*ended == Ended::NotEquivalent).then_some(Line::Script(line))
    }

    fn rerun_command(&self, draw: &Draw) -> String {
        rerun_command(self.x, draw)
    }

    fn out_of_time(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }
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
