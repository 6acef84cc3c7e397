//! Markdown for a pull-request comment: the verdict first, then the evidence.

use std::fmt::Write;

use super::{fraction, num, summary, ulps, values, verdict_line, Exporter};
use crate::judge::{Agreement, GroupDiff};
use crate::judge::{Outcome, Subject};

pub struct Markdown;

fn cells(g: &GroupDiff) -> String {
    let (abs, rel, used) = (num(g.max_abs), num(g.max_rel), fraction(g.worst_fraction));
    format!("{abs} | {rel} | {} | {used} | {}", ulps(g.max_ulps), g.verdict.label())
}

impl Exporter for Markdown {
    fn render(&self, o: &Outcome) -> String {
        let mut s = String::new();
        if let Some(why) = &o.no_verdict {
            let _ = writeln!(s, "### ddp-verify: {} {}\n", o.verdict().mark(), o.verdict().shout());
            if let Subject::Run(cfg) = &o.subject {
                super::describe::run_markdown(&mut s, cfg);
            }
            let _ = writeln!(s, "> {}", why.line());
            return s;
        }
        let _ = writeln!(s, "### ddp-verify: {} {}\n", o.verdict().mark(), o.verdict().shout());
        match &o.subject {
            Subject::Run(cfg) => super::describe::run_markdown(&mut s, cfg),
            Subject::Traces(pair) => {
                let _ = writeln!(s, "{}\n", super::describe::traces(o, pair).join("  \n"));
            }
        }
        let _ = writeln!(s, "> {}\n", verdict_line(o));
        if let Some(d) = &o.diagnosis {
            let _ = writeln!(s, "**Likely cause:** {}\n", d.detail);
            if let Some(at) = d.where_() {
                let _ = writeln!(s, "**Where:** {at}\n");
            }
        }
        if let Some(d) = o.big_batch.as_ref().and_then(|b| b.diagnosis.as_ref()).filter(|_| o.diagnosis.is_none()) {
            let _ = writeln!(s, "**Likely cause (vs the big batch):** {}\n", d.detail);
        }
        if let Some(d) = &o.caution {
            let _ = writeln!(s, "**Caution:** {}\n", d.detail);
        }
        for n in &o.notes {
            let _ = writeln!(s, "**Note:** {n}\n");
        }
        let _ =
            writeln!(s, "| step | max \\|Δ\\| | max rel | max ulp | used | verdict |\n|---:|---:|---:|---:|---:|:---|");
        for (i, g) in o.runs.steps.iter().enumerate() {
            let _ = writeln!(s, "| {i} | {} |", cells(g));
        }
        let _ = writeln!(s, "| final weights | {} |\n", cells(&o.runs.finals));
        if super::describe::wide(o) {
            let mut worst: Vec<_> = o.runs.finals.tensors.iter().collect();
            super::worst_first(&mut worst);
            let _ = writeln!(s, "<details><summary>Final weights: the 5 furthest apart</summary>\n");
            for d in worst.iter().take(5) {
                let _ = writeln!(
                    s,
                    "- `{}`: {} ulp, rel {}, {} of the allowed difference ({})",
                    d.name,
                    ulps(d.max_ulps),
                    num(d.max_rel),
                    fraction(d.worst_fraction),
                    d.verdict.label()
                );
            }
            let _ = writeln!(s, "\n</details>");
            if let Some(b) = &o.runs.buffers {
                let counted = if o.runs.buffers_counted { "counted (--strict-buffers)" } else { "not counted" };
                let label = match (b.verdict, o.runs.buffers_counted) {
                    (Agreement::Diverged, false) => "differ (expected)",
                    (v, _) => v.label(),
                };
                let title = super::buffers_title(b);
                let _ = writeln!(s, "\n**{title}** ({counted}): {label}. {}", super::buffer_explanation(o));
            }
        } else {
            let _ = writeln!(s, "<details><summary>Final weights</summary>\n");
            for (name, acc) in &o.accumulation.finals {
                let _ = writeln!(s, "- `{name}` accumulation `{}`", values(acc));
                if let Some((_, d)) = o.ddp.finals.iter().find(|(n, _)| n == name) {
                    let _ = writeln!(s, "- `{name}` ddp `{}`", values(d));
                }
            }
            let _ = writeln!(s, "\n</details>");
        }
        let words = o.config().map_or("a recorded trace", |cfg| super::describe::big_batch_words(&cfg.train));
        if o.config().is_some() || o.big_batch.is_some() {
            let _ = writeln!(s, "\n**Big batch** ({words})");
            if let Some(b) = &o.big_batch {
                let _ = writeln!(s, "- {} vs {}: {}", b.comparison.left, b.comparison.right, summary(&b.comparison));
            }
        }
        if let Some(g) = &o.golden_torch {
            let _ = writeln!(s, "\n**Golden** `{g}`\n");
            for c in &o.golden {
                let _ = writeln!(s, "- {} vs {}: {}", c.left, c.right, summary(c));
            }
        }
        s
    }
}
