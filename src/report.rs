//! What the user reads: a verdict table for people, and a JSON object for machines.

use std::fmt::Write;

use serde_json::{json, Value};

use crate::compare::{Comparison, GroupDiff, Verdict};
use crate::trace::Params;
use crate::verify::Outcome;

/// Version of the JSON written by `--save-trace DIR/report.json`.
pub const JSON_SCHEMA_VERSION: u32 = 1;

pub fn table(o: &Outcome) -> String {
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
        t.inject.map_or(String::new(), |b| format!("\ninjected bug: {} (planted in the {} run)", b.name(), b.side()))
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
    let _ = writeln!(s, "\nfinal weights (differences measured at each weight's largest magnitude during training)");
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
    s
}

fn row(g: &GroupDiff) -> String {
    format!("{:>10}  {:>10}  {:>8}  {}", num(g.max_abs), num(g.max_rel), ulps(g.max_ulps), g.verdict.label())
}

fn summary(c: &Comparison) -> String {
    let worst = c.steps.iter().chain([&c.finals]).map(|g| g.max_ulps).max().unwrap_or(0);
    let steps = if c.left_steps == c.right_steps {
        format!("{} steps + final weights", c.left_steps)
    } else {
        format!("{} vs {} steps", c.left_steps, c.right_steps)
    };
    format!("{steps}, max {} ulp: {}", ulps(worst), c.verdict.label())
}

fn verdict_line(o: &Outcome) -> String {
    let tol = &o.config.tolerance;
    let bound = format!("{} ulp or rel {:e} or abs {:e}", tol.max_ulps, tol.rtol, tol.atol);
    let all: Vec<&Comparison> = std::iter::once(&o.runs).chain(&o.golden).collect();
    let worst = all.iter().flat_map(|c| c.steps.iter().chain([&c.finals])).map(|g| g.max_ulps).max().unwrap_or(0);
    if o.verdict() != Verdict::Diverged {
        return format!("EQUIVALENT: every gradient and final weight within {bound} (worst seen: {} ulp)", ulps(worst));
    }
    let first = all.iter().find(|c| c.verdict == Verdict::Diverged).expect("a diverged comparison");
    let (what, g) = match first.steps.iter().position(|g| g.verdict == Verdict::Diverged) {
        Some(i) => (format!("step {i}"), &first.steps[i]),
        None if first.finals.verdict == Verdict::Diverged => ("final weights".to_string(), &first.finals),
        None => {
            return format!(
                "NOT EQUIVALENT: {} made {} optimizer steps but {} made {}",
                first.left, first.left_steps, first.right, first.right_steps
            )
        }
    };
    let t = g.tensors.iter().find(|t| t.verdict == Verdict::Diverged).expect("a diverged tensor");
    let detail = t.problem.clone().unwrap_or_else(|| {
        format!("max |Δ| {}, rel {}, {} ulp; allowed {bound}", num(t.max_abs), num(t.max_rel), ulps(t.max_ulps))
    });
    format!("NOT EQUIVALENT: {} vs {} first differ at {what}, {}: {detail}", first.left, first.right, t.name)
}

fn num(x: f64) -> String {
    if x == 0.0 {
        "0".into()
    } else {
        format!("{x:.3e}")
    }
}

fn ulps(u: u64) -> String {
    if u == u64::MAX {
        "-".into()
    } else {
        u.to_string()
    }
}

/// Up to 8 values at 4 decimals, as PyTorch prints the article's weights.
fn values(t: &tch::Tensor) -> String {
    let v = Vec::<f32>::try_from(&t.flatten(0, -1)).unwrap_or_default();
    let shown: Vec<String> = v.iter().take(8).map(|x| format!("{x:.4}")).collect();
    let more = if v.len() > 8 { format!(", ... ({} values)", v.len()) } else { String::new() };
    format!("[{}{more}]", shown.join(", "))
}

fn finals_json(p: &Params) -> Value {
    p.iter().map(|(n, t)| (n.clone(), json!(Vec::<f32>::try_from(&t.flatten(0, -1)).unwrap_or_default()))).collect()
}

pub fn json(o: &Outcome) -> Value {
    json!({
        "schema_version": JSON_SCHEMA_VERSION,
        "tool_version": env!("CARGO_PKG_VERSION"),
        "config": o.config.train,
        "tolerance": o.config.tolerance,
        "verdict": if o.verdict() == Verdict::Diverged { "not-equivalent" } else { "equivalent" },
        "runs": o.runs,
        "diagnosis": o.diagnosis,
        "golden": o.golden,
        "final_weights": { "accumulation": finals_json(&o.accumulation.finals), "ddp": finals_json(&o.ddp.finals) },
    })
}
