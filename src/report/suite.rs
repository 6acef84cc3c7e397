//! A suite's summary: one row (table, Markdown), object (JSON) or test case (JUnit) per case.

use std::fmt::Write;
use std::path::PathBuf;

use serde::Serialize;

use super::{escape_xml, verdict_line};
use crate::error::Result;
use crate::judge::{Diagnosis, Outcome, Verdict};
use crate::spec::{Format, ReportTarget};

#[derive(Serialize)]
pub struct SuiteReport {
    pub file: PathBuf,
    /// Ranks started once for every case.
    pub ranks: usize,
    pub cases: Vec<CaseResult>,
    /// Seconds the cases took, and starting the ranks before them.
    pub seconds: f64,
    pub start_seconds: Option<f64>,
}

#[derive(Serialize)]
pub struct CaseResult {
    pub name: String,
    /// The same verification as one command.
    pub command: String,
    pub gpus: usize,
    pub verdict: Verdict,
    /// The run's verdict line, as a single run prints it.
    pub summary: String,
    pub diagnosis: Option<Diagnosis>,
    /// The largest difference as a fraction of what it was allowed (the margin is 1 / this).
    pub worst_fraction: f64,
    pub steps: usize,
    pub seconds: f64,
}

impl CaseResult {
    pub fn new(name: &str, o: &Outcome, seconds: f64) -> Self {
        let train = &o.config().expect("a suite case is a run").train;
        let all = std::iter::once(&o.runs).chain(&o.golden);
        CaseResult {
            name: name.into(),
            command: train.command(),
            gpus: train.shape.gpus,
            verdict: o.verdict(),
            summary: verdict_line(o),
            diagnosis: o.diagnosis.clone(),
            worst_fraction: all.map(|c| c.worst_fraction).fold(0.0, f64::max),
            steps: o.runs.left_steps,
            seconds,
        }
    }

    /// A case of a user's script: `command` runs it alone.
    pub fn of_script(name: &str, command: String, gpus: usize, o: &Outcome, seconds: f64) -> Self {
        let all = std::iter::once(&o.runs).chain(o.big_batch.iter().filter(|b| b.decisive).map(|b| &b.comparison));
        CaseResult {
            name: name.into(),
            command,
            gpus,
            verdict: o.verdict(),
            summary: verdict_line(o),
            diagnosis: o.diagnosis.clone().or_else(|| o.big_batch.as_ref().and_then(|b| b.diagnosis.clone())),
            worst_fraction: all.map(|c| c.worst_fraction).fold(0.0, f64::max),
            steps: o.runs.left_steps,
            seconds,
        }
    }

    pub fn passed(&self) -> bool {
        self.verdict == Verdict::Equivalent
    }

    /// The line said on stderr as the `i`-th of `n` cases ends.
    pub fn progress_line(&self, i: usize, n: usize) -> String {
        format!("suite [{}/{n}] {}: {} ({:.1} s)", i + 1, self.name, self.verdict.shout(), self.seconds)
    }
}

impl SuiteReport {
    pub fn passed(&self) -> bool {
        self.cases.iter().all(CaseResult::passed)
    }

    /// 1 when a case was not equivalent, else 4 when a case got no verdict, else 0.
    pub fn exit(&self) -> crate::error::Exit {
        Verdict::of_all(self.cases.iter().map(|c| c.verdict)).exit()
    }

    fn failed(&self) -> usize {
        self.cases.iter().filter(|c| !c.passed()).count()
    }

    fn headline(&self) -> String {
        let n = self.cases.len();
        match self.failed() {
            0 => format!("EQUIVALENT: all {n} cases of {}", self.file.display()),
            f => format!("NOT EQUIVALENT: {f} of {n} cases of {}", self.file.display()),
        }
    }

    pub fn render(&self, format: Format) -> String {
        match format {
            Format::Table => self.table(),
            Format::Json => serde_json::to_string_pretty(self).expect("the suite report serialises") + "\n",
            Format::Markdown => self.markdown(),
            Format::Junit => self.junit(),
        }
    }

    fn table(&self) -> String {
        let mut s = String::new();
        let width = self.cases.iter().map(|c| c.name.len()).max().unwrap_or(4).max(4);
        let _ = writeln!(
            s,
            "ddp-verify suite {}: {} cases on {} ranks started once",
            self.file.display(),
            self.cases.len(),
            self.ranks
        );
        let _ =
            writeln!(s, "  {:<width$}  {:>2}  {:>5}  {:>8}  {:>7}  verdict", "case", "W", "steps", "used", "seconds");
        for c in &self.cases {
            let verdict = match c.verdict {
                Verdict::Equivalent => "equivalent",
                v => v.shout(),
            };
            let _ = writeln!(
                s,
                "  {:<width$}  {:>2}  {:>5}  {:>8}  {:>7.2}  {verdict}",
                c.name,
                c.gpus,
                c.steps,
                super::fraction(c.worst_fraction),
                c.seconds
            );
        }
        for c in self.cases.iter().filter(|c| !c.passed()) {
            let _ = writeln!(s, "\n{}: {}", c.name, c.summary);
            if let Some(d) = &c.diagnosis {
                let _ = writeln!(s, "  likely cause: {}", d.detail);
            }
            let _ = writeln!(s, "  rerun alone: {}", c.command);
        }
        let start = self.start_seconds.map_or(String::new(), |t| format!(", {t:.1} s starting the ranks"));
        let _ = writeln!(s, "\n{} ({:.1} s of cases{start})", self.headline(), self.seconds);
        s
    }

    fn markdown(&self) -> String {
        let mut s = String::new();
        let mark = if self.passed() { Verdict::Equivalent.mark() } else { Verdict::NotEquivalent.mark() };
        let _ = writeln!(s, "### ddp-verify suite: {mark} {}\n", self.headline());
        let _ = writeln!(s, "| case | W | steps | used | verdict |\n|:---|---:|---:|---:|:---|");
        for c in &self.cases {
            let verdict = match c.verdict {
                Verdict::Equivalent => format!("{} equivalent", c.verdict.mark()),
                v => format!("{} {}", v.mark(), v.shout()),
            };
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {verdict} |",
                c.name,
                c.gpus,
                c.steps,
                super::fraction(c.worst_fraction)
            );
        }
        for c in self.cases.iter().filter(|c| !c.passed()) {
            let _ = writeln!(s, "\n**{}**: {}", c.name, c.summary);
            if let Some(d) = &c.diagnosis {
                let _ = writeln!(s, "\n**Likely cause:** {}", d.detail);
            }
            let _ = writeln!(s, "\n`{}`", c.command);
        }
        s
    }

    fn junit(&self) -> String {
        let mut body = String::new();
        for c in &self.cases {
            let _ = write!(
                body,
                "    <testcase classname=\"ddp-verify.suite\" name=\"{}\" time=\"{:.3}\"",
                escape_xml(&c.name),
                c.seconds
            );
            if c.passed() {
                let _ = writeln!(body, "/>");
                continue;
            }
            let cause = c.diagnosis.as_ref().map_or(String::new(), |d| format!("\nlikely cause: {}", d.detail));
            let _ = writeln!(
                body,
                ">\n      <failure message=\"{}\">{}{}\nrerun alone: {}</failure>\n    </testcase>",
                escape_xml(&c.summary),
                escape_xml(&c.summary),
                escape_xml(&cause),
                escape_xml(&c.command)
            );
        }
        let (tests, failures) = (self.cases.len(), self.failed());
        let name = escape_xml(&self.file.display().to_string());
        format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"ddp-verify\" tests=\"{tests}\" failures=\"{failures}\">\n  <testsuite name=\"{name}\" tests=\"{tests}\" failures=\"{failures}\" time=\"{:.3}\">\n{body}  </testsuite>\n</testsuites>\n",
            self.seconds
        )
    }
}

/// Each report to its file or stdout.
pub fn write_all(r: &SuiteReport, targets: &[ReportTarget]) -> Result<()> {
    for t in targets {
        super::emit(&r.render(t.format), t.file())?;
    }
    Ok(())
}
