//! The verdict table, for people at a terminal.

use std::fmt::Write;

use super::{num, row, summary, ulps, values, verdict_line, Exporter};
use crate::judge::{Agreement, GroupDiff, TensorDiff};
use crate::judge::{Outcome, Subject};

pub struct Table;

impl Exporter for Table {
    fn render(&self, o: &Outcome) -> String {
        let mut s = String::new();
        if let Some(why) = &o.no_verdict {
            if let Subject::Run(cfg) = &o.subject {
                super::describe::run_table(&mut s, o, cfg);
            }
            let _ = writeln!(s, "\n{}", why.line());
            return s;
        }
        match &o.subject {
            Subject::Run(cfg) => super::describe::run_table(&mut s, o, cfg),
            Subject::Traces(pair) => {
                for line in super::describe::traces(o, pair) {
                    let _ = writeln!(s, "{line}");
                }
            }
        }
        let wide = super::describe::wide(o);
        let _ = writeln!(s, "\nper optimizer step: {} vs {} gradients", o.runs.left, o.runs.right);
        let worst_col = if wide { "  worst tensor" } else { "" };
        let _ = writeln!(
            s,
            "  {:>4}  {:>10}  {:>10}  {:>8}  {:>8}  verdict{worst_col}",
            "step", "max |Δ|", "max rel", "max ulp", "used"
        );
        for (i, g) in o.runs.steps.iter().enumerate() {
            let worst = if wide { format!("  {}", worst_name(g)) } else { String::new() };
            let _ = writeln!(s, "  {:>4}  {}{worst}", i, row(g));
        }
        if o.runs.left_steps != o.runs.right_steps {
            let _ = writeln!(
                s,
                "  {} made {} optimizer steps, {} made {}",
                o.runs.left, o.runs.left_steps, o.runs.right, o.runs.right_steps
            );
        }
        let adamw = o.config().is_some_and(|c| c.train.optim.optimizer == crate::spec::Optimizer::AdamW);
        let traces = matches!(o.subject, crate::judge::Subject::Traces(_));
        let measured = matches!(&o.subject, crate::judge::Subject::Traces(p) if matches!(p.precision, Some(Ok(_))));
        let how = match (o.runs.derived, adamw, traces) {
            (true, _, true) if measured => "each element against the precision control's measured distance",
            (true, _, true) => "each element against the fixed tolerance carried through AdamW",
            (true, false, _) => "each element against the bound carried through SGD",
            (true, true, _) => "each element, and AdamW's moments, against the bound carried through AdamW",
            _ => "differences measured at each weight's largest magnitude during training",
        };
        let _ = writeln!(s, "\nfinal weights ({how})");
        if wide {
            let _ = writeln!(
                s,
                "  {:<34}  {:>10}  {:>10}  {:>8}  {:>8}  verdict",
                "worst tensors", "max |Δ|", "max rel", "max ulp", "used"
            );
            for d in worst_tensors(&o.runs.finals, 5) {
                let _ = writeln!(s, "  {:<34}  {}", d.name, tensor_row(d));
            }
        } else {
            for (name, acc) in &o.accumulation.finals {
                let _ = writeln!(s, "  {name}");
                let _ = writeln!(s, "    accumulation  {}", values(acc));
                if let Some((_, d)) = o.ddp.finals.iter().find(|(n, _)| n == name) {
                    let _ = writeln!(s, "    ddp           {}", values(d));
                }
            }
            let _ = writeln!(
                s,
                "  {:<4}  {:>10}  {:>10}  {:>8}  {:>8}  verdict",
                "", "max |Δ|", "max rel", "max ulp", "used"
            );
        }
        let label = if wide { format!("all {} tensors", o.runs.finals.tensors.len()) } else { "all".into() };
        let _ = writeln!(s, "  {:<w$}  {}", label, row(&o.runs.finals), w = if wide { 34 } else { 4 });
        if let Some(b) = &o.runs.buffers {
            let counted = if o.runs.buffers_counted { "counted (--strict-buffers)" } else { "reported, not counted" };
            let _ = writeln!(s, "\n{} at the end: {counted}", super::buffers_title(b));
            let _ = writeln!(
                s,
                "  {:<34}  {:>10}  {:>10}  {:>8}  {:>8}  verdict",
                "worst buffers", "max |Δ|", "max rel", "max ulp", "used"
            );
            // Buffers are reported, not judged: furthest apart in ulps, not in allowance used
            // (an integer counter that differs at all has used an infinite one).
            let mut furthest: Vec<&TensorDiff> = b.tensors.iter().collect();
            furthest.sort_by_key(|d| std::cmp::Reverse((d.verdict, d.max_ulps)));
            for &d in furthest.iter().take(3) {
                let mut line = tensor_row(d);
                if !o.runs.buffers_counted && d.verdict == Agreement::Diverged {
                    line = line.replace("DIVERGED", "differs (expected)");
                }
                let _ = writeln!(s, "  {:<34}  {line}", d.name);
            }
            let _ = writeln!(s, "  {}", super::buffer_explanation(o));
        }
        if let Some(cfg) = o.config() {
            let _ = writeln!(s, "\nbig batch: {}", super::describe::big_batch_words(&cfg.train));
        } else if let Some(p) = match &o.subject {
            crate::judge::Subject::Traces(pair) => pair.big.as_ref(),
            crate::judge::Subject::Run(_) => None,
        } {
            let _ = writeln!(s, "\nbig batch: the trace {}", p.display());
        }
        if let Some(b) = &o.big_batch {
            let c = &b.comparison;
            let _ = writeln!(s, "  {} vs {} gradients, per optimizer step", c.left, c.right);
            for (i, g) in c.steps.iter().enumerate() {
                let worst = if wide { format!("  {}", worst_name(g)) } else { String::new() };
                let _ = writeln!(s, "  {:>4}  {}{worst}", i, row(g));
            }
            let _ = writeln!(s, "  {:>4}  {}  (final weights)", "end", row(&c.finals));
            if c.left_steps != c.right_steps {
                let _ = writeln!(
                    s,
                    "  {} made {} optimizer steps, {} made {}",
                    c.left, c.left_steps, c.right, c.right_steps
                );
            }
        }
        if let Some(g) = &o.golden_torch {
            let _ = writeln!(s, "\ngolden {g}");
            for c in &o.golden {
                let _ = writeln!(s, "  {:<12} vs {:<20} {}", c.left, c.right, summary(c));
            }
        }
        let _ = writeln!(s, "\n{}", verdict_line(o));
        if let Some(d) = &o.diagnosis {
            let _ = writeln!(s, "likely cause: {}", d.detail);
            if let Some(at) = d.where_() {
                let _ = writeln!(s, "where: {at}");
            }
        }
        if let Some(d) = o.big_batch.as_ref().and_then(|b| b.diagnosis.as_ref()).filter(|_| o.diagnosis.is_none()) {
            let _ = writeln!(s, "likely cause (vs the big batch): {}", d.detail);
        }
        if let Some(d) = &o.caution {
            let _ = writeln!(s, "caution: {}", d.detail);
        }
        for n in &o.notes {
            let _ = writeln!(s, "note: {n}");
        }
        let cfg = o.config();
        if let Some((true, Some(dir))) = cfg.map(|c| (c.bless, &c.golden)) {
            let done = if o.agreement() == Agreement::Diverged {
                "NOT blessed: the runs are not equivalent"
            } else {
                "blessed"
            };
            let _ = writeln!(s, "golden {}: {done}", dir.display());
        }
        if let Some((true, cfg, Some(dir))) =
            cfg.map(|c| (o.golden.iter().any(|c| c.verdict == Agreement::Diverged), c, &c.golden))
        {
            let cmd = format!("{} --golden {}", cfg.train.command(), dir.display());
            let _ = writeln!(s, "inspect:  {cmd} --save-trace {}-inspect", dir.display());
            let _ = writeln!(s, "re-bless: {cmd} --bless   (only if the change is intended)");
        }
        s
    }
}

/// The tensor that used most of its allowance in a group.
fn worst_name(g: &GroupDiff) -> &str {
    let worst = g.tensors.iter().filter(|t| t.verdict != Agreement::Exact).max_by(|a, b| {
        (a.verdict, a.worst_fraction).partial_cmp(&(b.verdict, b.worst_fraction)).unwrap_or(std::cmp::Ordering::Equal)
    });
    worst.map_or("-", |t| t.name.as_str())
}

/// The `n` tensors furthest apart, worst first (ties keep name order).
fn worst_tensors(g: &GroupDiff, n: usize) -> Vec<&TensorDiff> {
    let mut all: Vec<&TensorDiff> = g.tensors.iter().collect();
    super::worst_first(&mut all);
    all.truncate(n);
    all
}

fn tensor_row(d: &TensorDiff) -> String {
    format!(
        "{:>10}  {:>10}  {:>8}  {:>8}  {}",
        num(d.max_abs),
        num(d.max_rel),
        ulps(d.max_ulps),
        super::fraction(d.worst_fraction),
        d.verdict.label()
    )
}
