//! The explore summary: counts, the bug table, shrunk commands and the time split.

use std::fmt::Write;

use super::{ExploreReport, Tally};
use crate::report::fraction;
use crate::spec::Bug;

impl ExploreReport {
    /// Honest cases all equivalent; every bug caught wherever it changes the math, never
    /// where it cannot, and exercised at least once.
    pub fn passed(&self) -> bool {
        self.tallies.iter().all(|t| match t.bug {
            None => t.not_equivalent == 0,
            Some(_) => t.missed == 0 && t.false_alarms == 0 && t.caught > 0,
        })
    }

    pub fn to_text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "explore: {} random configurations per pass (seed {}; replay with --seed {}), up to {} ranks, {}",
            self.cases,
            self.seed,
            self.seed,
            self.max_gpus,
            self.models.iter().map(|m| m.name()).collect::<Vec<_>>().join(" and ")
        );
        for t in self.tallies.iter().filter(|t| t.bug.is_none()) {
            let _ = writeln!(s, "  cases            {:>6}{}", t.cases, replayed(t));
            let _ = writeln!(s, "    of which ResNet {:>5}", t.resnet_cases);
            let _ =
                writeln!(s, "  worst case used  {:>6} of its allowed difference (1 is the edge)", fraction(t.max_used));
            let _ = writeln!(
                s,
                "  equivalent       {:>6}",
                t.cases - t.not_equivalent - t.blew_up - t.unjudged - t.no_verdict
            );
            if t.no_verdict > 0 {
                let _ = writeln!(
                    s,
                    "  no verdict       {:>6} (this machine's kernels gave other bits for the same micro-batch: \
                     neither pass nor alarm; try --kernels portable)",
                    t.no_verdict
                );
            }
            if t.unjudged > 0 {
                let _ = writeln!(
                    s,
                    "  nothing judged   {:>6} (every step skipped by both loss scalers, or parted by float16's range)",
                    t.unjudged
                );
            }
            if t.blew_up > 0 {
                let _ = writeln!(
                    s,
                    "  training blew up {:>6} (NaN/Inf in both runs: drawn out, proves nothing)",
                    t.blew_up
                );
            }
            let _ = writeln!(s, "  not equivalent   {:>6}{}", t.not_equivalent, reasons(t));
        }
        let bugs: Vec<&Tally> = self.tallies.iter().filter(|t| t.bug.is_some()).collect();
        let mut notes = Vec::new();
        if !bugs.is_empty() {
            let _ = writeln!(
                s,
                "\n  {:<20} {:<13} {:>7} {:>13} {:>7} {:>7} {:>7} {:>8}  likely cause reported",
                "injected bug", "planted in", "configs", "changes math", "caught", "missed", "false+", "margin"
            );
            for t in &bugs {
                let b = t.bug.expect("bug tally");
                notes.push(format!("    {:<20} {}", b.name(), b.harmless_when()));
                let _ = writeln!(
                    s,
                    "  {:<20} {:<13} {:>7} {:>13} {:>7} {:>7} {:>7} {:>8} {}",
                    b.name(),
                    b.side().name(),
                    t.cases,
                    t.changes_math,
                    t.caught,
                    t.missed,
                    t.false_alarms,
                    t.min_margin.map_or("-".into(), |m| if m.is_finite() {
                        format!("{}x", fraction(m))
                    } else {
                        "inf".into()
                    }),
                    reasons(t)
                );
            }
            let _ = writeln!(
                s,
                "  margin: the smallest factor by which a caught case's worst difference exceeded what it was allowed"
            );
            let reordered: Vec<String> = bugs
                .iter()
                .filter(|t| t.reordered > 0)
                .map(|t| format!("{} {} (fired on {})", t.bug.map_or("", Bug::name), t.reordered, t.reordered_fired))
                .collect();
            if !reordered.is_empty() {
                let _ = writeln!(
                    s,
                    "  only reordered (the same sums added in another order: rounding, counted neither way): {}",
                    reordered.join(", ")
                );
            }
            let _ =
                writeln!(s, "\n  configs a bug cannot change (counted out of \"changes math\"):\n{}", notes.join("\n"));
        }
        let examples: Vec<&Tally> = self.tallies.iter().filter(|t| t.example.is_some()).collect();
        if !examples.is_empty() {
            let _ = writeln!(s, "\n  shrunk cases (proptest):");
            for t in examples {
                let e = t.example.as_ref().expect("example");
                let _ = writeln!(s, "  {}: {}", e.what, e.config.command());
                if let Some(d) = &e.diagnosis {
                    let _ = writeln!(s, "      likely cause: {}", d.detail);
                }
            }
        }
        let tm = &self.timing;
        let runs: usize = self.tallies.iter().map(|t| t.cases).sum();
        let per_s = runs as f64 / tm.total.max(1e-9);
        let _ = writeln!(
            s,
            "\ntime: {runs} cases in {:.1} s = {per_s:.1} configs/s ({:.0} per minute; {} evaluations with shrinking)",
            tm.total,
            per_s * 60.0,
            tm.evaluations
        );
        if let Some(start) = tm.start {
            let _ = writeln!(s, "  start: mpirun, processes, libtorch load, MPI init  {start:>7.2} s (once)");
        }
        let _ = writeln!(s, "  DDP ranks (rank 0's share, waits included)       {:>7.2} s", tm.ddp);
        let _ = writeln!(s, "    of which inside collectives                     {:>7.2} s", tm.comm);
        let _ = writeln!(s, "  accumulation run                                  {:>7.2} s", tm.accumulation);
        let _ = writeln!(s, "  comparison and diagnosis                          {:>7.2} s", tm.compare);
        let verdict = if self.passed() && self.tallies.iter().any(|t| t.no_verdict > 0) {
            "NO VERDICT on some cases: this machine's kernels do not repeat themselves (exit 4)"
        } else if self.passed() {
            if bugs.is_empty() {
                "EQUIVALENT on every case"
            } else {
                "GATE OK: every planted bug caught wherever it changes the math"
            }
        } else if bugs.is_empty() {
            "NOT EQUIVALENT on some cases (see the shrunk command above)"
        } else {
            "GATE PROBLEM: a bug was missed, raised a false alarm, or was never exercised (see above)"
        };
        let _ = writeln!(s, "\n{verdict}");
        s
    }
}

fn replayed(t: &Tally) -> String {
    let mut s = String::new();
    if t.replayed > 0 {
        s += &format!(" ({} replayed from the regressions file first)", t.replayed);
    }
    if t.skipped_regressions > 0 {
        s += &format!(" ({} regressions skipped: they need more ranks than --max-gpus)", t.skipped_regressions);
    }
    s
}

fn reasons(t: &Tally) -> String {
    let parts: Vec<String> = t.reasons.iter().map(|(r, n)| format!("{r} {n}")).collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!(" {}", parts.join(", "))
    }
}
