//! A user's legs while they run (`ddp-verify -- python train.py`). On a terminal, one line
//! redrawn in place: the leg, its optimizer step (of the steps the first leg made) and the
//! seconds so far. Elsewhere (a CI log) nothing is redrawn: one line per leg when it ends.
//! The steps are what the recorder's rank 0 keeps in the file DDP_VERIFY_PROGRESS names.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

/// The variable naming the file (python/ddp_verify_trace/_progress.py's `ENV`).
pub const ENV: &str = "DDP_VERIFY_PROGRESS";

pub struct LegProgress {
    leg: &'static str,
    file: PathBuf,
    /// The steps the first leg made: the same training, so the same count.
    of: Option<usize>,
    tty: bool,
    /// The line on the terminal now, if any.
    drawn: Option<String>,
    /// Nothing printed (explore prints a line per case instead).
    quiet: bool,
}

impl LegProgress {
    pub fn new(leg: &'static str, file: PathBuf, of: Option<usize>, quiet: bool) -> Self {
        let _ = std::fs::remove_file(&file);
        LegProgress { leg, file, of, tty: !quiet && std::io::stderr().is_terminal(), drawn: None, quiet }
    }

    /// Optimizer steps recorded so far, where the recorder said.
    pub fn steps(&self) -> Option<usize> {
        std::fs::read_to_string(&self.file).ok()?.trim().parse().ok()
    }

    /// Redraws the line (on a terminal only).
    pub fn tick(&mut self, elapsed: Duration) {
        if !self.tty {
            return;
        }
        let now = line(self.leg, self.steps(), self.of, elapsed);
        if self.drawn.as_ref() != Some(&now) {
            eprint!("\r\x1b[2K{now}");
            self.drawn = Some(now);
        }
    }

    /// The leg ended with its trace: its line, kept; the steps it made.
    pub fn done(&mut self, elapsed: Duration) -> Option<usize> {
        self.clear();
        let steps = self.steps();
        if self.quiet {
            return steps;
        }
        let made = steps.map_or(String::new(), |n| format!("{n} optimizer steps in "));
        eprintln!("ddp-verify: the {} leg: {made}{:.1} s", self.leg, elapsed.as_secs_f64());
        steps
    }

    /// Takes the redrawn line away (before any other message).
    pub fn clear(&mut self) {
        if self.drawn.take().is_some() {
            eprint!("\r\x1b[2K");
        }
    }
}

/// The count is the leg's to say while it runs, not an output to keep.
impl Drop for LegProgress {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.file);
    }
}

fn line(leg: &str, steps: Option<usize>, of: Option<usize>, elapsed: Duration) -> String {
    let step = match (steps, of) {
        (Some(n), Some(m)) => format!("step {n} of {m}, "),
        (Some(n), None) => format!("step {n}, "),
        (None, _) => "starting, ".into(),
    };
    format!("ddp-verify: the {leg} leg: {step}{:.0} s", elapsed.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_says_the_leg_its_step_and_the_time() {
        let s = Duration::from_secs_f64(3.4);
        assert_eq!(line("ddp", Some(12), Some(64), s), "ddp-verify: the ddp leg: step 12 of 64, 3 s");
        assert_eq!(line("accumulation", Some(5), None, s), "ddp-verify: the accumulation leg: step 5, 3 s");
        assert_eq!(line("ddp", None, Some(64), s), "ddp-verify: the ddp leg: starting, 3 s");
    }
}
