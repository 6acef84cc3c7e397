//! Markdown for a pull-request comment: the verdict first, then the evidence.

use std::fmt::Write;

use super::{num, summary, ulps, values, verdict_line, Exporter};
use crate::compare::{GroupDiff, Verdict};
use crate::verify::Outcome;

pub struct Markdown;

fn cells(g: &GroupDiff) -> String {
    format!("{} | {} | {} | {}", num(g.max_abs), num(g.max_rel), ulps(g.max_ulps), g.verdict.label())
}

impl Exporter for Markdown {
    fn render(&self, o: &Outcome) -> String {
        let t = &o.config.train;
        let mut s = String::new();
        let ok = o.verdict() != Verdict::Diverged;
        let _ = writeln!(s, "### ddp-verify: {}\n", if ok { "✅ EQUIVALENT" } else { "❌ NOT EQUIVALENT" });
        let _ = writeln!(
            s,
            "Linear model, N={} D={}, batch {}: K={} accumulation steps vs W={} DDP ranks, {} epochs, lr {}, momentum {}, shuffle {}, drop_last {}, seed {}.\n",
            t.data_size, t.features, t.batch_size, t.acc_steps, t.gpus, t.epochs, t.lr, t.momentum, t.shuffle, t.drop_last, t.seed
        );
        let _ = writeln!(s, "> {}\n", verdict_line(o));
        if let Some(d) = &o.diagnosis {
            let _ = writeln!(s, "**Likely cause:** {}\n", d.detail);
        }
        let _ = writeln!(s, "| step | max \\|Δ\\| | max rel | max ulp | verdict |\n|---:|---:|---:|---:|:---|");
        for (i, g) in o.runs.steps.iter().enumerate() {
            let _ = writeln!(s, "| {i} | {} |", cells(g));
        }
        let _ = writeln!(s, "| final weights | {} |\n", cells(&o.runs.finals));
        let _ = writeln!(s, "<details><summary>Final weights</summary>\n");
        for (name, acc) in &o.accumulation.finals {
            let _ = writeln!(s, "- `{name}` accumulation `{}`", values(acc));
            if let Some((_, d)) = o.ddp.finals.iter().find(|(n, _)| n == name) {
                let _ = writeln!(s, "- `{name}` ddp `{}`", values(d));
            }
        }
        let _ = writeln!(s, "\n</details>");
        if let Some(g) = &o.golden_torch {
            let _ = writeln!(s, "\n**Golden** `{g}`\n");
            for c in &o.golden {
                let _ = writeln!(s, "- {} vs {}: {}", c.left, c.right, summary(c));
            }
        }
        s
    }
}
