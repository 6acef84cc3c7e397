//! The skeleton against a mock subject (hyperfine tests its runs against a mock executor):
//! what it replays, draws, shrinks and keeps, with no script and no rank.

use proptest::prelude::*;
use proptest::strategy::BoxedStrategy;

use super::{search, Line, ScriptLine, Stage, Subject};
use crate::error::Result;
use crate::spec::{Draw, Exploration};

/// Cases are numbers; those from `fails_from` up fail.
struct Mock {
    fails_from: u32,
    stops: bool,
    /// Draws left before the time is spent.
    time: Option<usize>,
    runs: Vec<(u32, Stage)>,
}

impl Mock {
    fn new(stops: bool) -> Self {
        Mock { fails_from: 100, stops, time: None, runs: Vec::new() }
    }

    fn ran(&self, stage: fn(&Stage) -> bool) -> Vec<u32> {
        self.runs.iter().filter(|(_, s)| stage(s)).map(|(c, _)| *c).collect()
    }
}

fn line(case: u32) -> Line {
    let draw =
        Draw { gpus: 2, acc_steps: case as usize, batch: None, data_size: None, seed: None, axes: Default::default() };
    Line::Script(ScriptLine { command: vec!["mock".into()], draw })
}

impl Subject for Mock {
    type Case = u32;
    type Finding = bool;
    const SHRINK_RUNS: usize = 40;

    fn strategy(&self) -> BoxedStrategy<u32> {
        (0u32..1000).boxed()
    }

    fn replays(&self, lines: Vec<Line>) -> Vec<u32> {
        let mine = |l: Line| match l {
            Line::Script(s) => Some(s.draw.acc_steps as u32),
            Line::Config(_) => None,
        };
        lines.into_iter().filter_map(mine).collect()
    }

    fn gpus(_: &u32) -> usize {
        2
    }

    fn run(&mut self, case: &u32, stage: Stage) -> Result<bool> {
        self.runs.push((*case, stage));
        if let (Stage::Draw { .. }, Some(t)) = (stage, self.time.as_mut()) {
            *t = t.saturating_sub(1);
        }
        Ok(*case >= self.fails_from)
    }

    fn worth(&self, fails: &bool) -> u8 {
        u8::from(*fails)
    }

    fn stops(&self, fails: &bool) -> bool {
        self.stops && *fails
    }

    fn regression(&self, case: &u32, fails: &bool) -> Option<Line> {
        fails.then(|| line(*case))
    }

    fn rerun_command(&self, case: &u32) -> String {
        format!("mock {case}")
    }

    fn out_of_time(&self) -> bool {
        self.time == Some(0)
    }
}

fn exploration(dir: &tempfile::TempDir, seed: u64) -> Exploration {
    Exploration { cases: 20, seed, max_gpus: 2, regressions: dir.path().join("r.txt"), json: false }
}

/// A subject that stops at a failure: drawing ends there, the failure shrinks to the
/// smallest that fails within the budget, is kept, and is replayed first next time, when
/// nothing is drawn.
#[test]
fn the_first_failure_is_shrunk_kept_and_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let mut mock = Mock::new(true);
    let explored = search(&mut mock, &exploration(&dir, 1)).unwrap();
    let draws = mock.ran(|s| matches!(s, Stage::Draw { .. }));
    assert_eq!(draws.iter().filter(|&&c| c >= 100).count(), 1, "{draws:?}");
    assert!(*draws.last().unwrap() >= 100 && explored.drawn == draws.len());
    assert!(mock.ran(|s| *s == Stage::Shrink).len() <= Mock::SHRINK_RUNS);
    let worst = explored.worst.unwrap();
    assert_eq!((worst.case, worst.finding, worst.replayed), (100, true, false));
    assert_eq!(
        (worst.kept_in.as_deref(), worst.rerun.as_str()),
        (Some(dir.path().join("r.txt").as_path()), "mock 100")
    );
    assert_eq!(super::regressions::read(&dir.path().join("r.txt")).unwrap(), [line(100)]);

    let mut again = Mock::new(true);
    let explored = search(&mut again, &exploration(&dir, 2)).unwrap();
    assert_eq!((explored.replayed, explored.drawn), (1, 0));
    assert_eq!(again.runs, [(100, Stage::Replay { done: 1, of: 1 })]);
    let worst = explored.worst.unwrap();
    assert!(worst.replayed && worst.kept_in.is_none());
}

/// A subject that tallies draws every case and shrinks the worst; the same seed draws the
/// same cases, another seed others.
#[test]
fn every_case_is_drawn_and_the_seed_replays_them() {
    let dir = tempfile::tempdir().unwrap();
    let draws = |seed| {
        let mut mock = Mock { fails_from: 2000, ..Mock::new(false) };
        let explored = search(&mut mock, &exploration(&dir, seed)).unwrap();
        assert!(explored.worst.is_none() && mock.ran(|s| *s == Stage::Shrink).is_empty());
        mock.ran(|s| matches!(s, Stage::Draw { .. }))
    };
    assert_eq!(draws(7).len(), 20);
    assert_eq!(draws(7), draws(7));
    assert_ne!(draws(7), draws(8));
    let mut mock = Mock::new(false);
    let explored = search(&mut mock, &exploration(&dir, 7)).unwrap();
    assert_eq!((explored.drawn, explored.worst.map(|w| w.case)), (20, Some(100)));
}

/// The time given ends the drawing, and says so.
#[test]
fn the_time_given_stops_drawing() {
    let dir = tempfile::tempdir().unwrap();
    let mut mock = Mock { fails_from: 2000, time: Some(3), ..Mock::new(true) };
    let explored = search(&mut mock, &exploration(&dir, 1)).unwrap();
    assert_eq!((explored.drawn, explored.stopped_by_max_time), (3, true));
}
