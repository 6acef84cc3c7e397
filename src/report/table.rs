//! The verdict table, for people at a terminal.

use std::fmt::Write;

use super::{row, summary, values, verdict_line, Exporter};
use crate::compare::Verdict;
use crate::verify::Outcome;

pub struct Table;

impl Exporter for Table {
    fn render(&self, o: &Outcome) -> String {
        let t = &o.config.train;
        let mut s = String::new();
        let onoff = |b: bool| if b { "on" } else { "off" };
        let _ = writeln!(
            s,
            "ddp-verify: linear model, N={} D={}, batch {}, K={} micro-batches per step vs W={} DDP ranks (Open MPI), \
             {} epochs, lr {}, momentum {}, shuffle {}, drop_last {}, seed {}{}",
            t.data_size,
            t.features,
            t.batch_size,
            t.acc_steps,
            t.gpus,
            t.epochs,
            t.lr,
            t.momentum,
            onoff(t.shuffle),
            onoff(t.drop_last),
            t.seed,
            t.inject.map_or(String::new(), |b| format!(
                "\ninjected bug: {} (planted in the {} run)",
                b.name(),
                b.side()
            ))
        );
        let _ = writeln!(s, "\nper optimizer step: {} vs {} gradients", o.runs.left, o.runs.right);
        let _ = writeln!(s, "  {:>4}  {:>10}  {:>10}  {:>8}  verdict", "step", "max |Δ|", "max rel", "max ulp");
        for (i, g) in o.runs.steps.iter().enumerate() {
            let _ = writeln!(s, "  {:>4}  {}", i, row(g));
        }
        if o.runs.left_steps != o.runs.right_steps {
            let _ = writeln!(
                s,
                "  {} made {} optimizer steps, {} made {}",
                o.runs.left, o.runs.left_steps, o.runs.right, o.runs.right_steps
            );
        }
        let _ =
            writeln!(s, "\nfinal weights (differences measured at each weight's largest magnitude during training)");
        for (name, acc) in &o.accumulation.finals {
            let _ = writeln!(s, "  {name}");
            let _ = writeln!(s, "    accumulation  {}", values(acc));
            if let Some((_, d)) = o.ddp.finals.iter().find(|(n, _)| n == name) {
                let _ = writeln!(s, "    ddp           {}", values(d));
            }
        }
        let _ = writeln!(s, "  {:<4}  {:>10}  {:>10}  {:>8}  verdict", "", "max |Δ|", "max rel", "max ulp");
        let _ = writeln!(s, "  {:<4}  {}", "all", row(&o.runs.finals));
        if let Some(g) = &o.golden_torch {
            let _ = writeln!(s, "\ngolden {g}");
            for c in &o.golden {
                let _ = writeln!(s, "  {:<12} vs {:<20} {}", c.left, c.right, summary(c));
            }
        }
        let _ = writeln!(s, "\n{}", verdict_line(o));
        if let Some(d) = &o.diagnosis {
            let _ = writeln!(s, "likely cause: {}", d.detail);
        }
        if let (true, Some(dir)) = (o.config.bless, &o.config.golden) {
            let done =
                if o.verdict() == Verdict::Diverged { "NOT blessed: the runs are not equivalent" } else { "blessed" };
            let _ = writeln!(s, "golden {}: {done}", dir.display());
        }
        if let (true, Some(dir)) = (o.golden.iter().any(|c| c.verdict == Verdict::Diverged), &o.config.golden) {
            let cmd = format!("{} --golden {}", o.config.train.command(), dir.display());
            let _ = writeln!(s, "inspect:  {cmd} --save-trace {}-inspect", dir.display());
            let _ = writeln!(s, "re-bless: {cmd} --bless   (only if the change is intended)");
        }
        s
    }
}
