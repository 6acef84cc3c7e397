//! The verdict table, for people at a terminal.

use std::fmt::Write;

use super::{num, row, summary, ulps, values, verdict_line, Exporter};
use crate::judge::Outcome;
use crate::judge::{GroupDiff, TensorDiff, Verdict};

pub struct Table;

impl Exporter for Table {
    fn render(&self, o: &Outcome) -> String {
        let t = &o.config.train;
        let mut s = String::new();
        let onoff = |b: bool| if b { "on" } else { "off" };
        if t.model.is_resnet() {
            resnet_header(&mut s, o);
        } else {
            let _ = writeln!(
                s,
                "ddp-verify: linear model{}, N={} D={}, batch {}, K={} micro-batches per step vs W={} DDP ranks ({}), \
                 {} epochs, lr {}, momentum {}, shuffle {}, drop_last {}, seed {}{}",
                super::dtype_note(t),
                t.data_size,
                t.features,
                t.batch_size,
                t.acc_steps,
                t.gpus,
                super::engine(o),
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
            if t.lockstep {
                let _ = writeln!(s, "mode: {}", super::mode(o));
            }
        }
        if !o.config.device_note.is_empty() {
            let _ = writeln!(s, "device: {}", o.config.device_note);
        }
        let wide = t.model.is_resnet();
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
        let how = if o.runs.derived {
            "each element against the bound carried through SGD"
        } else {
            "differences measured at each weight's largest magnitude during training"
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
            let _ = writeln!(s, "\nBatchNorm buffers at the end: {counted}");
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
                if !o.runs.buffers_counted && d.verdict == Verdict::Diverged {
                    line = line.replace("DIVERGED", "differs (expected)");
                }
                let _ = writeln!(s, "  {:<34}  {line}", d.name);
            }
            let _ = writeln!(s, "  {}", super::buffer_explanation(o));
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

fn resnet_header(s: &mut String, o: &Outcome) {
    let t = &o.config.train;
    let onoff = |b: bool| if b { "on" } else { "off" };
    let _ = writeln!(
        s,
        "ddp-verify: {} ({} parameter tensors, {}), N={} images 3x{}x{}, {} classes, batch {}, \
         K={} micro-batches per step vs W={} DDP ranks ({}), {} epochs{}, lr {}, momentum {}, weight decay {}, \
         shuffle {}, drop_last {}, seed {}, init {}",
        t.model.name(),
        o.accumulation.finals.len(),
        t.dtype.name(),
        t.data_size,
        t.image_size,
        t.image_size,
        t.classes,
        t.batch_size,
        t.acc_steps,
        t.gpus,
        super::engine(o),
        t.epochs,
        t.max_steps.map_or(String::new(), |m| format!(" (at most {m} steps)")),
        t.lr,
        t.momentum,
        t.weight_decay,
        onoff(t.shuffle),
        onoff(t.drop_last),
        t.seed,
        t.init.as_ref().map_or("seeded (ours)".to_string(), |p| p.display().to_string()),
    );
    if let Some(b) = t.inject {
        let _ = writeln!(s, "injected bug: {} (planted in the {} run)", b.name(), b.side());
    }
    let _ = writeln!(s, "mode: {}", super::mode(o));
}

/// The tensor that used most of its allowance in a group.
fn worst_name(g: &GroupDiff) -> &str {
    let worst = g.tensors.iter().filter(|t| t.verdict != Verdict::Exact).max_by(|a, b| {
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
