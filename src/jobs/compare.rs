//! `ddp-verify compare A B`: two traces recorded elsewhere (a user's own loop through the
//! `ddp_verify_trace` recorder, or `--save-trace`), judged and reported like a run.

use std::path::Path;

use crate::error::{Error, Exit, Result};
use crate::evidence::{Params, Trace};
use crate::judge::{
    caution, diagnose, needless_sync, Agreement, BigBatch, Comparer, Context, Outcome, Subject, TracePair,
};
pub use crate::spec::CompareOptions;
use crate::spec::Dtype;

pub fn command(opts: &CompareOptions) -> Result<Exit> {
    let outcome = judge_traces(opts)?;
    crate::report::write_all(&outcome, &opts.reports)?;
    Ok(outcome.exit())
}

/// Reads both traces, checks they line up, and judges them.
pub fn judge_traces(opts: &CompareOptions) -> Result<Outcome> {
    let [pa, pb] = &opts.paths;
    let (mut a, mut b) = (Trace::load(pa)?, Trace::load(pb)?);
    strip_ddp_prefix(&mut a, &b);
    strip_ddp_prefix(&mut b, &a);
    let recorded = [a.sampling.is_some(), b.sampling.is_some()];
    same_sampling(&mut a, &mut b, pa, pb)?;
    line_up(&a, &b, pa, pb)?;
    let dtype = a.finals[0].1.dtype().unwrap_or(Dtype::Float32);
    // Users' runs train on their own: the free-running tolerance of their dtype, or of the
    // dtype an engine computed in where coarser (FSDP2's MixedPrecisionPolicy): the same
    // reordering, rounded at that precision.
    let computed = [a.header.compute_dtype, b.header.compute_dtype].into_iter().flatten();
    let coarsest = computed.chain([dtype]).max_by(|x, y| x.epsilon().total_cmp(&y.epsilon())).unwrap_or(dtype);
    let tolerance = opts.tolerance.tolerance(coarsest, false);
    let labels = labels(pa, pb);
    // Two runs of one kind must agree in their buffers too; DDP's follow rank 0 only.
    let same_kind = a.header.run.is_some() && a.header.run == b.header.run;
    // Under AdamW the final weights are held to what its steps make of each step's allowance.
    let finals_carried =
        crate::judge::adamw_finals(&a, &b, &tolerance, dtype).map(|bounds| a.allowances.finals = bounds);
    let finals_judged = finals_carried.is_ok() || crate::judge::finals_judged(&a, &b);
    let runs = Comparer::new(&labels[0], &labels[1], &tolerance, None)
        .derived(finals_carried.is_ok())
        .finals_judged(finals_judged)
        .finish(&a, &b, opts.strict_buffers || same_kind);
    let cx = Context::of_traces(&a, &b);
    let diagnosis = diagnose(&a, &b, &runs, &cx);
    let costs = crate::judge::costs([&labels[0], &labels[1]], &a, &b);
    let caution = diagnosis.is_none().then(|| caution(&a, &b, &runs, &cx).or_else(|| needless_sync(&costs))).flatten();
    let big_batch = match &opts.big {
        Some(path) => Some(judge_big_batch(&a, path, pa, &labels[0], &tolerance, dtype, &cx, runs.verdict)?),
        None => None,
    };
    let pair = TracePair {
        paths: opts.paths.clone(),
        headers: [a.header.clone(), b.header.clone()],
        tolerance,
        plot: opts.plot.clone(),
        magnitudes: !a.scales.is_empty() && !b.scales.is_empty(),
        peaks: !a.peaks.is_empty() && !b.peaks.is_empty(),
        finals_carried,
        big: opts.big.clone(),
        sampling: crate::judge::SampledPair::of(&a, &b, recorded),
        costs,
    };
    Ok(Outcome {
        subject: Subject::Traces(Box::new(pair)),
        accumulation: a,
        ddp: b,
        runs,
        big_batch,
        golden: Vec::new(),
        golden_torch: None,
        diagnosis,
        no_verdict: None,
        caution,
    })
}

/// Accumulation against a big-batch trace: one process, one batch of each step's samples.
/// A mismatch there while DDP agrees is a normalisation both runs share (a per-micro-batch
/// mean over samples or tokens of varying count).
#[allow(clippy::too_many_arguments)]
fn judge_big_batch(
    a: &Trace,
    path: &Path,
    pa: &Path,
    label: &str,
    tolerance: &crate::spec::Tolerance,
    dtype: Dtype,
    cx: &Context,
    runs: Agreement,
) -> Result<BigBatch> {
    let mut big = Trace::load(path)?;
    strip_ddp_prefix(&mut big, a);
    let mut acc = a.without_steps();
    acc.allowances.finals = Params::new();
    acc.steps = a.steps.clone();
    acc.scales = a.scales.clone();
    same_sampling(&mut acc, &mut big, pa, path)?;
    line_up(&acc, &big, pa, path)?;
    let carried = crate::judge::adamw_finals(&acc, &big, tolerance, dtype).map(|b| acc.allowances.finals = b);
    let comparison = Comparer::new(label, "big batch", tolerance, None)
        .derived(carried.is_ok())
        .finals_judged(carried.is_ok() || crate::judge::finals_judged(&acc, &big))
        .finish(&acc, &big, false);
    let diagnosis = crate::judge::diagnose_big_batch(&acc, &big, &comparison, cx, runs != Agreement::Diverged);
    Ok(BigBatch { trace: big, comparison, diagnosis })
}

/// Both traces sampled at the same positions: a whole trace is sampled at the other's (so a
/// sampled leg compares with a whole one); two sampled at other positions are refused.
fn same_sampling(a: &mut Trace, b: &mut Trace, pa: &Path, pb: &Path) -> Result<()> {
    match (&a.sampling, &b.sampling) {
        (None, None) => {}
        (Some(x), Some(y)) => {
            if let Some(p) = x.mismatch(y) {
                return Err(not_lined_up(pa, pb, p));
            }
        }
        (Some(s), None) => *b = std::mem::take(b).sampled_like(s).map_err(|p| not_lined_up(pa, pb, p))?,
        (None, Some(s)) => *a = std::mem::take(a).sampled_like(s).map_err(|p| not_lined_up(pa, pb, p))?,
    }
    Ok(())
}

/// `pb` does not line up with `pa` (exit 2).
fn not_lined_up(pa: &Path, pb: &Path, problem: String) -> Error {
    Error::bad_file(
        pb,
        format!("does not line up with {}: {problem}", pa.display()),
        "record both runs of the same model with the same sample= (ddp-verify -- COMMAND: --sample)",
    )
}

/// What each side is called in reports: its file name without `.safetensors`, or the
/// whole path where both have the same name.
fn labels(a: &Path, b: &Path) -> [String; 2] {
    let stem = |p: &Path| p.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let (sa, sb) = (stem(a), stem(b));
    if sa != sb && !sa.is_empty() && !sb.is_empty() {
        [sa, sb]
    } else {
        [a.display().to_string(), b.display().to_string()]
    }
}

/// A DDP module's parameters are named `module.<name>` when recorded from the wrapper: where
/// every name of `t` has that prefix and none of `other`'s, drop it.
fn strip_ddp_prefix(t: &mut Trace, other: &Trace) {
    const P: &str = "module.";
    let all = |t: &Trace| t.finals.iter().all(|(n, _)| n.starts_with(P));
    let none = |t: &Trace| !t.finals.iter().any(|(n, _)| n.starts_with(P));
    if !(all(t) && none(other)) {
        return;
    }
    let strip = |p: &mut Params| p.iter_mut().for_each(|(n, _)| *n = n[P.len()..].to_string());
    if let Some(s) = t.sampling.as_mut() {
        s.rename(|n| n.strip_prefix(P).unwrap_or(n).to_string());
    }
    t.steps.iter_mut().chain(t.scales.iter_mut()).for_each(strip);
    [&mut t.finals, &mut t.peaks].into_iter().for_each(strip);
    t.buffers.iter_mut().filter(|(n, _)| n.starts_with(P)).for_each(|(n, _)| *n = n[P.len()..].to_string());
}

/// Same steps, parameter names, shapes and dtypes; else the first mismatch, exit 2.
fn line_up(a: &Trace, b: &Trace, pa: &Path, pb: &Path) -> Result<()> {
    let refuse = |problem: String| {
        Err(Error::bad_file(
            pb,
            format!("does not line up with {}: {problem}", pa.display()),
            "record both runs of the same model (the same parameters, shapes and dtype)",
        ))
    };
    // Different numbers of optimizer steps are judged (NOT EQUIVALENT, with their cause),
    // not refused: the steps both made must hold the same tensors.
    // A step with no gradient at all (an engine that reduced none) is judged too.
    let steps = a.steps.iter().zip(&b.steps).enumerate().filter(|(_, (x, y))| !x.is_empty() && !y.is_empty());
    let groups = steps.map(|(s, (x, y))| (format!("step {s}"), x, y));
    let groups = groups.chain([("the final weights".to_string(), &a.finals, &b.finals)]).chain([(
        "the buffers".to_string(),
        &a.buffers,
        &b.buffers,
    )]);
    for (what, x, y) in groups {
        for (name, t) in x {
            let Some((_, u)) = y.iter().find(|(n, _)| n == name) else {
                return refuse(format!("{name} is in {what} there but not here"));
            };
            if t.size() != u.size() {
                return refuse(format!("{what}: {name} has shape {:?} there, {:?} here", t.size(), u.size()));
            }
            if t.elem() != u.elem() {
                return refuse(format!("{what}: {name} is {} there, {} here", t.elem().name(), u.elem().name()));
            }
        }
        if let Some((name, _)) = y.iter().find(|(n, _)| !x.iter().any(|(m, _)| m == n)) {
            return refuse(format!("{name} is in {what} here but not there"));
        }
    }
    Ok(())
}
