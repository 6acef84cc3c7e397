//! `watch`'s report: one run judged by each stage's contract, in the four formats. The words
//! say what was checked and what was not: with no reference run, "held" is never "equivalent
//! to one process" in full.

use std::fmt::Write;

use serde_json::json;

use super::{emit, escape_xml};
use crate::error::Result;
use crate::judge::{Held, Verdict, Watched};
use crate::spec::{Format, ReportTarget};

/// What a held watch does not prove, said beside every verdict.
const UNCHECKED: &str = "no reference run: a mistake every rank makes alike (a loss scaled inside a framework's \
                         backward, a wrong K on every rank) is not seen; the two-run check (ddp-verify -- COMMAND) \
                         proves full equivalence";

pub fn write_all(w: &Watched, targets: &[ReportTarget]) -> Result<()> {
    for t in targets {
        emit(&render(t.format, w), t.file())?;
    }
    Ok(())
}

pub fn render(format: Format, w: &Watched) -> String {
    match format {
        Format::Table => table(w),
        Format::Json => serde_json::to_string_pretty(&value(w)).unwrap_or_default() + "\n",
        Format::Markdown => markdown(w),
        Format::Junit => junit(w),
    }
}

fn headline(w: &Watched) -> String {
    match w.verdict() {
        Verdict::NotEquivalent => "CONTRACT BROKEN".to_string(),
        Verdict::Equivalent => "EVERY CONTRACT CHECKED HELD".to_string(),
        Verdict::NoVerdict => "NO VERDICT: no contract could be checked".to_string(),
    }
}

fn held_word(h: Held) -> &'static str {
    match h {
        Held::Held => "held",
        Held::Broken => "BROKEN",
        Held::NotChecked => "not checked",
    }
}

fn fault_lines(w: &Watched) -> Vec<String> {
    let Some(d) = &w.fault else { return Vec::new() };
    let at = d.step.map_or("the whole run".to_string(), |s| format!("step {s}"));
    let mut lines = vec![format!("first broken at {at}: {}", d.reason.name())];
    if let Some(place) = d.where_() {
        lines.push(format!("where: {place}"));
    }
    lines.push(format!("cause: {}", d.detail));
    lines
}

fn table(w: &Watched) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "ddp-verify watch: {}", headline(w));
    let _ = writeln!(
        s,
        "one run of {} process(es), {} optimizer step(s), judged by each stage's contract",
        w.world, w.steps
    );
    for c in &w.contracts {
        let why = c.unchecked.map_or(String::new(), |u| format!(" ({u})"));
        let _ = writeln!(s, "  {:<15} {:<12} {}{why}", c.stage.name(), held_word(c.held), c.says);
    }
    for l in fault_lines(w) {
        let _ = writeln!(s, "{l}");
    }
    for n in &w.notes {
        let _ = writeln!(s, "note: {n}");
    }
    let _ = writeln!(s, "not checked: {UNCHECKED}");
    s
}

fn value(w: &Watched) -> serde_json::Value {
    json!({
        "verdict": w.verdict().word(),
        "mode": "watch",
        "world_size": w.world,
        "steps": w.steps,
        "contracts": w.contracts,
        "fault": w.fault.as_ref().map(|d| json!({ "step": d.step, "diagnosis": d })),
        "notes": w.notes,
        "not_checked": UNCHECKED,
    })
}

fn markdown(w: &Watched) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "### ddp-verify watch: {}\n", headline(w));
    let _ = writeln!(s, "One run of {} process(es), {} optimizer step(s).\n", w.world, w.steps);
    let _ = writeln!(s, "| stage | contract | |\n|---|---|---|");
    for c in &w.contracts {
        let why = c.unchecked.map_or(String::new(), |u| format!(" ({u})"));
        let _ = writeln!(s, "| {} | {} | {}{why} |", c.stage.name(), c.says, held_word(c.held));
    }
    let lines = fault_lines(w);
    if !lines.is_empty() {
        let _ = writeln!(s);
        for l in lines {
            let _ = writeln!(s, "- {l}");
        }
    }
    for n in &w.notes {
        let _ = writeln!(s, "\n**Note:** {n}");
    }
    let _ = writeln!(s, "\n_Not checked: {UNCHECKED}._");
    s
}

fn junit(w: &Watched) -> String {
    let mut s = String::new();
    let failures = w.contracts.iter().filter(|c| c.held == Held::Broken).count();
    let skipped = w.contracts.iter().filter(|c| c.held == Held::NotChecked).count();
    let _ = writeln!(s, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>");
    let _ = writeln!(
        s,
        "<testsuites>\n  <testsuite name=\"ddp-verify watch\" tests=\"{}\" failures=\"{failures}\" skipped=\"{skipped}\">",
        w.contracts.len()
    );
    for c in &w.contracts {
        let _ = write!(s, "    <testcase classname=\"ddp-verify.watch\" name=\"{}\"", escape_xml(c.stage.name()));
        match c.held {
            Held::Held => {
                let _ = writeln!(s, "/>");
            }
            Held::NotChecked => {
                let _ = writeln!(
                    s,
                    ">\n      <skipped message=\"{}\"/>\n    </testcase>",
                    escape_xml(c.unchecked.unwrap_or(""))
                );
            }
            Held::Broken => {
                let lines = fault_lines(w);
                let _ = writeln!(
                    s,
                    ">\n      <failure message=\"{}\">{}</failure>\n    </testcase>",
                    escape_xml(lines.first().map_or("", String::as_str)),
                    escape_xml(&lines.join("\n"))
                );
            }
        }
    }
    let _ = writeln!(s, "  </testsuite>\n</testsuites>");
    s
}
