//! `ddp-verify compare A B`: two traces recorded elsewhere (a user's own loop through the
//! `ddp_verify_trace` recorder, or `--save-trace`), judged and reported like a run.

use std::path::Path;

use crate::error::{Exit, Result};
use crate::evidence::{BigLeg, Legs};
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
    let Legs { accumulation: mut a, ddp: b, big, sampled } = Legs::load(&opts.paths, opts.big.as_deref())?;
    let [pa, pb] = &opts.paths;
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
    let big_batch = big.map(|leg| judge_big_batch(leg, &labels[0], &tolerance, dtype, &cx, runs.verdict));
    let pair = TracePair {
        paths: opts.paths.clone(),
        headers: [a.header.clone(), b.header.clone()],
        tolerance,
        plot: opts.plot.clone(),
        magnitudes: !a.scales.is_empty() && !b.scales.is_empty(),
        peaks: !a.peaks.is_empty() && !b.peaks.is_empty(),
        finals_carried,
        big: opts.big.clone(),
        sampling: crate::judge::SampledPair::of(&a, &b, sampled),
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
fn judge_big_batch(
    leg: BigLeg,
    label: &str,
    tolerance: &crate::spec::Tolerance,
    dtype: Dtype,
    cx: &Context,
    runs: Agreement,
) -> BigBatch {
    let BigLeg { accumulation: mut acc, trace: big } = leg;
    let carried = crate::judge::adamw_finals(&acc, &big, tolerance, dtype).map(|b| acc.allowances.finals = b);
    let comparison = Comparer::new(label, "big batch", tolerance, None)
        .derived(carried.is_ok())
        .finals_judged(carried.is_ok() || crate::judge::finals_judged(&acc, &big))
        .finish(&acc, &big, false);
    let diagnosis = crate::judge::diagnose_big_batch(&acc, &big, &comparison, cx, runs != Agreement::Diverged);
    BigBatch { trace: big, comparison, diagnosis }
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
