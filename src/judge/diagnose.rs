//! Plain-words likely causes for a mismatch, from the shape of the evidence: a constant
//! ratio between the runs' gradients, a gradient that still holds the previous step's, a
//! mismatch that starts only in a later epoch, or different samples behind a step.

use serde::Serialize;

use super::{Comparison, Reason, Verdict};
use crate::evidence::{Params, Trace};
use crate::spec::TrainConfig;

/// What a diagnosis may assume about the runs behind two traces.
#[derive(Debug, Clone, Copy)]
pub struct Context {
    /// Optimizer steps per epoch, when known: a mismatch that starts in a later epoch
    /// points at the sampler's epoch.
    pub steps_per_epoch: Option<usize>,
    /// The runs' machine epsilon.
    pub eps: f64,
    /// Whether equivalent runs may drift apart step by step (a deep net trained free-running).
    pub chaos_possible: bool,
    /// ddp-verify trained the runs (its flags can be named), or a user recorded them (`compare`).
    pub ours: bool,
    /// The loss is normalised by token counts (tiny-lm), which a wrong count changes.
    pub token_loss: bool,
    /// Whether both runs' plans put the same samples in every step, when known.
    pub same_samples: Option<bool>,
    /// The first step made by a window shorter than K (`--partial-window step`), if any,
    /// with what it holds over K: the factor dividing it by K would leave.
    pub first_short: Option<(usize, f64)>,
    /// The optimizer is AdamW, which hides a gradient's scale from the weights.
    pub adamw: bool,
    /// The framework that called optimizer.step() in a user's run (the recorder's header),
    /// where it divides the loss by its accumulation steps itself.
    pub framework: Option<&'static str>,
}

/// Frameworks that divide each micro-batch's loss by their accumulation steps themselves,
/// with the setting that does it.
pub const LOSS_DIVIDING_FRAMEWORKS: [(&str, &str); 3] = [
    ("lightning", "Lightning's Trainer(accumulate_grad_batches=K)"),
    ("accelerate", "Accelerate's accelerator.backward under accumulate()"),
    ("transformers", "Transformers' Trainer (gradient_accumulation_steps)"),
];

impl Context {
    pub fn of_run(t: &TrainConfig) -> Self {
        use crate::plan::StepPlan;
        let acc = StepPlan::accumulation(t, t.inject);
        let ranks: Vec<StepPlan> = (0..t.shape.gpus).map(|r| StepPlan::rank(t, r, t.inject)).collect();
        let same_samples = acc.steps.len() == ranks[0].steps.len()
            && acc.steps.iter().enumerate().all(|(s, step)| {
                let mut mine: Vec<i64> = step.concat();
                let mut theirs: Vec<i64> = ranks.iter().flat_map(|p| p.steps[s].concat()).collect();
                mine.sort_unstable();
                theirs.sort_unstable();
                mine == theirs
            });
        let correct = StepPlan::accumulation(t, None);
        Context {
            steps_per_epoch: Some(crate::plan::sampler::steps_per_epoch(t)),
            eps: t.precision.dtype.epsilon(),
            chaos_possible: t.model.kind.is_deep() && !t.run.lockstep,
            ours: true,
            token_loss: t.model.kind.token_loss(),
            same_samples: Some(same_samples),
            framework: None,
            first_short: correct
                .steps
                .iter()
                .position(|s| s.len() < t.shape.acc_steps)
                .map(|i| (i, correct.steps[i].len() as f64 / t.shape.acc_steps as f64)),
            adamw: t.optim.optimizer == crate::spec::Optimizer::AdamW,
        }
    }

    /// Two traces a user recorded: nothing known beyond their precision.
    pub fn of_traces(eps: f64, chaos_possible: bool) -> Self {
        Context {
            steps_per_epoch: None,
            eps,
            chaos_possible,
            ours: false,
            token_loss: false,
            same_samples: None,
            first_short: None,
            adamw: false,
            framework: None,
        }
    }
}

/// Under an explicit --max-ulps/--rtol/--atol, differences this small are rounding: 64 ulps
/// of float32 or float64; in bfloat16 and float16 an ulp is so coarse that 8 already is.
/// (Under the derived bounds a divergence is never rounding: they allow twice what it can do.)
fn rounding_ulps(eps: f64) -> u64 {
    if eps > 1e-6 {
        8
    } else {
        64
    }
}

/// What rounding can do to one value in the run's precision (`eps`), relative to it: the
/// bounds below were set for float32 and float64; narrower types round more.
fn slack(float32_bound: f64, eps: f64, ulps: f64) -> f64 {
    float32_bound.max(ulps * eps)
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Diagnosis {
    /// Short and stable, for counting by reason.
    pub reason: Reason,
    pub detail: String,
}

/// `cx` says how steps map to epochs and in what precision the runs computed. A
/// free-running deep net that parts the way chaos does is named as such, whatever else
/// its evidence resembles.
pub fn diagnose(a: &Trace, b: &Trace, c: &Comparison, cx: &Context) -> Option<Diagnosis> {
    let d = cause(a, b, c, cx)?;
    Some(chaos(c, cx).unwrap_or(d))
}

/// A free-running deep net whose first step agrees to rounding and whose first differing
/// step is still small: the signature of chaos, not of a bug (a wrong split or scale shows at step
/// 0; a stale gradient or a missing set_epoch is recognised before this is asked).
fn chaos(runs: &Comparison, cx: &Context) -> Option<Diagnosis> {
    if !cx.chaos_possible || runs.steps.first()?.verdict == Verdict::Diverged {
        return None;
    }
    let s = runs.steps.iter().position(|g| g.verdict == Verdict::Diverged)?;
    // Chaos starts from rounding and grows by orders of magnitude per step (measured about
    // 1e3 in float32); a step that jumps straight to a 1% difference is something else.
    if runs.steps[s].max_rel > 1e-2 {
        return None;
    }
    let growth: Vec<String> = runs.steps.iter().take(s + 2).map(|g| format!("{:.0e}", g.max_rel)).collect();
    let fix = match cx.ours {
        true => "rerun with --lockstep (the default) or --dtype float64 to prove equivalence",
        false => "record fewer steps, or train in float64, to prove equivalence",
    };
    Some(Diagnosis {
        reason: Reason::Chaos,
        detail: format!(
            "step 0 agrees to rounding, then the difference grows step by step (max rel {}): a deep net amplifies \
             rounding, so equivalent free-running runs part like this; {fix}",
            growth.join(" -> ")
        ),
    })
}

fn cause(a: &Trace, b: &Trace, c: &Comparison, cx: &Context) -> Option<Diagnosis> {
    let eps = cx.eps;
    if c.verdict != Verdict::Diverged {
        return None;
    }
    if let Some(d) = one_process(a, b, c) {
        return Some(d);
    }
    if c.left_steps != c.right_steps {
        return Some(step_count(a, b, c));
    }
    if let Some(d) = c.rank_drift.as_ref().filter(|d| d.tensor.starts_with("grad ")) {
        return Some(unsynced(a, b, d));
    }
    if let Some(d) = &c.rank_drift {
        return Some(Diagnosis {
            reason: Reason::RanksDiffer,
            detail: format!(
                "after step {} DDP rank {} held another {} than rank 0: the ranks no longer train one model; a \
                 parameter left out of the all-reduce (a hand-written all-reduce that skips one, a parameter \
                 registered after DDP wrapped the model) steps with each rank's own gradient",
                d.step, d.rank, d.tensor
            ),
        });
    }
    if let Some(l) = c.lr {
        return Some(Diagnosis {
            reason: Reason::LrSchedule,
            detail: format!(
                "{} applied lr {} at step {} where {} applied {}: their schedules ticked a different number of \
                 times by then; tick once per optimizer step in both (scheduler.step() after optimizer.step()), \
                 not once per micro-batch (K times faster) nor once per process (a scheduler prepared by \
                 Accelerate steps W times per step under DDP)",
                c.left,
                super::LrMismatch::shown(l.left),
                l.step,
                c.right,
                super::LrMismatch::shown(l.right)
            ),
        });
    }
    if let Some(m) = c.scaler {
        use super::ScalerEvent::*;
        let why = match m.what {
            Unscales => {
                "unscale once per optimizer step, after the last micro-batch's backward (and DDP's all-reduce): \
                 unscaling inside the accumulation loop divides earlier micro-batches' share by the scale again"
            }
            Updates | LossScale => {
                "scaler.update() belongs once per optimizer step, after scaler.step(): updating after every \
                 micro-batch grows the scale K times as often, and a scale changed inside a window scales its \
                 micro-batches differently than the one unscale divides by"
            }
            Skipped => {
                "every run must see the same overflow: one rank's inf/NaN reaches every rank through the \
                 all-reduce, and accumulation sums the same micro-batches; a run that checks other gradients \
                 (before the all-reduce, or per rank) skips alone"
            }
        };
        return Some(Diagnosis {
            reason: Reason::LossScaler,
            detail: format!("{}: {why}", m.describe(&c.left, &c.right)),
        });
    }
    let first_bad = c.steps.iter().chain([&c.finals]).flat_map(|g| &g.tensors).find_map(|t| t.problem.as_ref());
    if let Some(p) = first_bad.filter(|p| p.starts_with("non-finite")) {
        return Some(Diagnosis {
            reason: Reason::NonFinite,
            detail: format!(
                "{p}: training blew up (learning rate too high, or bad data); nothing can be proven from NaN or Inf"
            ),
        });
    }
    let Some(s) = c.steps.iter().position(|g| g.verdict == Verdict::Diverged) else {
        return Some(after_the_gradients(c, cx));
    };
    let ulps = c.steps[s].max_ulps;
    if !c.derived && ulps <= rounding_ulps(eps) {
        let (which, fix) = match cx.ours {
            true => ("explicit", "drop --max-ulps/--rtol/--atol to judge by the bound derived from it"),
            false => (
                "fixed",
                "record micro-batch magnitudes per element (record(magnitudes=\"element\"), \
                     DDP_VERIFY_MAGNITUDES=element) or pass a looser --max-ulps/--rtol",
            ),
        };
        return Some(Diagnosis {
            reason: Reason::ExplicitTolerance,
            detail: format!(
                "step {s} differs by only {ulps} ulp, which floating-point rounding explains (e.g. the order W partial gradients are summed in); the {which} tolerance ({} ulp) is tighter than the arithmetic allows: {fix}",
                c.tolerance.max_ulps
            ),
        });
    }
    let (Some(xs), Some(ys)) = (a.steps.get(s), b.steps.get(s)) else {
        // Streamed: the gradients were compared as they came and not kept (only ours).
        return Some(Diagnosis {
            reason: Reason::DifferentGradients,
            detail: format!(
                "step {s}'s gradients differ by more than rounding (rerun with --save-trace to inspect them)"
            ),
        });
    };
    if let Some(d) = step_record(a, b, c, cx, s) {
        return Some(d);
    }
    if let Some(d) = user_dropout(a, b, c, s).filter(|_| !cx.ours) {
        return Some(d);
    }
    let (x, y) = (flat(xs), flat(ys));
    // Stale first: it only starts after step 0, and for a model whose gradient does not
    // depend on the weights it can also look like a constant ratio.
    if s > 0 {
        for (side, own, other) in [(&c.right, b, &x), (&c.left, a, &y)] {
            let prev = flat(&own.steps[s - 1]);
            let now = flat(&own.steps[s]);
            let stale: Vec<f64> = prev.iter().zip(other).map(|(p, o)| p + o).collect();
            if close(&now, &stale, eps) {
                return Some(Diagnosis {
                    reason: Reason::StaleGradients,
                    detail: format!(
                        "{side}'s gradient at step {s} is step {}'s plus this step's: gradients are not zeroed after optimizer.step()",
                        s - 1
                    ),
                });
            }
        }
    }
    if let Some(d) = clipped_factor(a, b, c, cx, s, &x, &y) {
        return Some(d);
    }
    if let Some(r) = constant_ratio(&x, &y, eps) {
        return Some(Diagnosis {
            reason: Reason::LossScaling,
            detail: format!(
                "{} gradients are exactly {r:.2}x {}'s from step {s}: {}{}",
                c.right,
                c.left,
                loss_scaling_fix(cx),
                if cx.adamw {
                    "; under AdamW the weights barely show it (Adam divides by √v, so a gradient K times too large \
                     makes almost the same step), which is why the gradients are compared"
                } else {
                    ""
                }
            ),
        });
    }
    if let Some(r) = fitted_ratio(&x, &y, eps) {
        return Some(Diagnosis {
            reason: Reason::UniformFactor,
            detail: format!(
                "{} gradients are a uniform {r:.4}x {}'s in every tensor at step {s}: the same samples, scaled \
                 differently (a loss or gradient multiplied by a factor in one run only)",
                c.right, c.left
            ),
        });
    }
    // A count is off by whole tokens, percents of it; the same samples regrouped (a bug that
    // only reorders sums) differ by rounding.
    if cx.token_loss && cx.same_samples == Some(true) && c.steps[s].max_rel > 1e-3 {
        return Some(Diagnosis {
            reason: Reason::TokenCountPerRank,
            detail: format!(
                "the runs see the same samples in every step, yet step {s} differs by more than rounding and not by one \
                 factor: they divide by different token counts; each rank must divide by the step's count over all \
                 ranks (all-reduce it before backward), not by its own"
            ),
        });
    }
    let epoch = cx.steps_per_epoch.map_or(0, |n| s / n.max(1));
    if epoch > 0 {
        return Some(Diagnosis {
            reason: Reason::EpochDependentSampling,
            detail: format!(
                "the runs agree through epoch {} and first differ in epoch {epoch} (step {s}): the shuffle differs between epochs; is set_epoch(epoch) called on every rank's sampler?",
                epoch - 1
            ),
        });
    }
    Some(Diagnosis {
        reason: Reason::DifferentSamples,
        detail: format!(
            "step {s} differs by more than rounding and not by a constant factor: the runs likely see different samples in that step (strided vs contiguous split, padding)"
        ),
    })
}

/// Every step's gradients agree, yet the runs differ: in what the optimizer made of them,
/// or in the buffers.
fn after_the_gradients(c: &Comparison, cx: &Context) -> Diagnosis {
    if c.finals.verdict != Verdict::Diverged {
        return Diagnosis {
            reason: Reason::Buffers,
            detail: "every gradient and final weight agrees but the buffers (BatchNorm's running statistics) \
                     differ: DDP keeps rank 0's (broadcast_buffers), so compare runs of one kind, or leave buffers \
                     out (no --strict-buffers)"
                .into(),
        };
    }
    let detail = match (cx.ours, c.derived) {
        (false, false) => "every step's gradients agree within tolerance but the final weights do not: the \
                           optimizer made different steps of the same gradients, or amplified their rounding (Adam \
                           and AdamW divide by √v, so a parameter whose true gradient is zero, such as an attention \
                           key bias, moves a full step on rounding noise); record with ddp_verify_trace.record() \
                           or TraceRecorder(optimizer=...) so the bound is carried through the optimizer"
            .to_string(),
        _ => "every step's gradients agree but the final weights differ beyond what the optimizer makes of that \
              agreement: the runs' optimizers differ (their settings, their state, or a step applied to other \
              parameters)"
            .to_string(),
    };
    Diagnosis { reason: Reason::OptimizerStep, detail }
}

/// What to do about a whole-number factor: divide by K, or not again where a framework does.
fn loss_scaling_fix(cx: &Context) -> String {
    match LOSS_DIVIDING_FRAMEWORKS.iter().find(|(f, _)| Some(*f) == cx.framework) {
        Some((_, how)) => format!(
            "loss scaling; {how} already divides each loss by the accumulation steps, so a loss divided by K \
             in your own step is divided twice: return the plain mean loss"
        ),
        None => "loss scaling (divide each loss by K in accumulation, by K/W on each rank)".into(),
    }
}

/// A trace meant as DDP's (its `leg` header, or its name) written by a world of 1, beside
/// another one-process trace: the "DDP" leg never started its W processes.
fn one_process(a: &Trace, b: &Trace, c: &Comparison) -> Option<Diagnosis> {
    let one = |t: &Trace| t.meta.get("world_size").is_some_and(|w| w == "1");
    if !one(a) || !one(b) {
        return None;
    }
    let meant = |l: &String, t: &Trace| t.meta.get("leg").map_or(l.contains("ddp"), |leg| leg == "ddp");
    let (label, _) = [(&c.left, a), (&c.right, b)].into_iter().find(|(l, t)| meant(l, t))?;
    Some(Diagnosis {
        reason: Reason::OneProcess,
        detail: format!(
            "{label} was written by a world of 1: the DDP leg ran as one process, without its ranks \
             (`accelerate launch --cpu` starts one process unless given --multi_gpu --num_processes W; \
             torchrun needs --nproc_per_node W); launch it with W processes and record again"
        ),
    })
}

/// K as a trace's header gives it.
fn header_k(t: &Trace) -> Option<usize> {
    t.meta.get("acc_steps")?.parse().ok()
}

/// A DDP rank's gradient that differs from rank 0's, traced to the micro-batches whose
/// backward ran without DDP's all-reduce where the recorder saw DDP's forwards: an
/// all-reduce covers everything accumulated before it, so the micro-batches after the last
/// synchronised one stay local to each rank.
fn unsynced(a: &Trace, b: &Trace, d: &crate::evidence::RankDrift) -> Diagnosis {
    let (param, step, rank) = (&d.tensor["grad ".len()..], d.step, d.rank);
    let head = format!("at step {step} DDP rank {rank}'s gradient of {param} differs from rank 0's");
    let t = if a.rank_drift.is_some() { a } else { b };
    let flags = t.ddp_sync.get(step).filter(|f| !f.is_empty());
    let detail = match flags {
        Some(f) => {
            let local = f.iter().rev().take_while(|&&synced| !synced).count();
            let m = f.len();
            if local == m {
                format!(
                    "{head}: none of this rank's {m} micro-batches was all-reduced (require_backward_grad_sync was \
                     False, or no_sync() was on, when each forward ended, which is when DDP decides), so each rank \
                     stepped with its own gradient; let the last micro-batch's forward run with it True"
                )
            } else if local > 0 {
                let which = if local == 1 {
                    format!("micro-batch {m}")
                } else {
                    format!("micro-batches {}-{m}", m - local + 1)
                };
                format!(
                    "{head}: {which} of this rank's {m} ran the backward without DDP's all-reduce \
                     (require_backward_grad_sync was False when its forward ended, which is when DDP decides: \
                     set it before calling the model, or run all but the last micro-batch under model.no_sync()), \
                     so each rank stepped with the synchronised sum of the earlier micro-batches plus its own local \
                     gradient of the rest"
                )
            } else {
                format!(
                    "{head} although DDP all-reduced this step's last micro-batch (and with it every earlier one): \
                     something changed the gradient on one rank after the all-reduce (a gradient hook, a clip or a \
                     scaling that runs on some ranks only)"
                )
            }
        }
        None if t.meta.get("ddp_forward").is_some_and(|f| f == "none") => format!(
            "{head}: no DistributedDataParallel forward ran (the model is not wrapped in DDP, or is called \
             through its .module), so nothing all-reduced the gradients; wrap the model and call the wrapper"
        ),
        None => format!(
            "{head}: DDP all-reduces a synchronised backward into the same gradient on every rank, so part of \
             this one was never all-reduced; a micro-batch that should sync ran without it \
             (require_backward_grad_sync set after the forward, no_sync around the last micro-batch) and each rank \
             steps with its own mix of synced and local gradients"
        ),
    };
    Diagnosis { reason: Reason::UnsyncedGradient, detail }
}

/// Different numbers of optimizer steps, named by what the recorder counted: a run that
/// steps every micro-batch, or at another cadence, else different numbers of micro-batches.
fn step_count(a: &Trace, b: &Trace, c: &Comparison) -> Diagnosis {
    let typical = |t: &Trace| {
        let mut m: Vec<i64> = t.micro.clone();
        m.sort_unstable();
        m.get(m.len() / 2).copied()
    };
    let (l, r) = (&c.left, &c.right);
    let (ls, rs) = (c.left_steps, c.right_steps);
    let detail = match (typical(a), typical(b)) {
        (Some(1), Some(k)) | (Some(k), Some(1)) if k > 1 => {
            let (one, other) = if typical(a) == Some(1) { (l, r) } else { (r, l) };
            format!(
                "{one} steps the optimizer after every micro-batch ({} steps, 1 backward each) where {other} \
                 steps after {k} ({} steps): one run does not accumulate; call optimizer.step() and zero_grad() \
                 once per K micro-batches (K/W per rank under DDP)",
                if one == l { ls } else { rs },
                if one == l { rs } else { ls }
            )
        }
        (Some(1), Some(1)) if header_k(a).or(header_k(b)).is_some_and(|k| k > 1) => format!(
            "{l} made {ls} optimizer steps and {r} made {rs}, each after a single backward though K={}: neither run \
             accumulates; call optimizer.step() and zero_grad() once per K micro-batches (K/W per rank under DDP)",
            header_k(a).or(header_k(b)).unwrap_or(1)
        ),
        (Some(x), Some(y)) if x != y => format!(
            "{l} made {ls} optimizer steps of {x} backward passes each and {r} made {rs} of {y}: the runs step at \
             different cadences; the accumulation condition must step once per K micro-batches in total \
             ((i + 1) % K == 0, K/W per rank), not e.g. i % (K - 1) == 0"
        ),
        _ => format!(
            "{l} made {ls} optimizer steps and {r} made {rs}: the samplers give different numbers of micro-batches"
        ),
    };
    Diagnosis { reason: Reason::StepCount, detail }
}

/// A factor clipping put into one run's gradients: where the records say clipping ran on one
/// side only at step `s`, the factor before clipping is what the loop did (a whole one is
/// loss scaling); else clipping itself scaled the same gradients differently.
fn clipped_factor(
    a: &Trace,
    b: &Trace,
    c: &Comparison,
    cx: &Context,
    s: usize,
    x: &[f64],
    y: &[f64],
) -> Option<Diagnosis> {
    let (ca, cb) = (a.clip_norms.get(s).copied().flatten(), b.clip_norms.get(s).copied().flatten());
    let coef = |n: Option<(f64, f64)>| n.map_or(1.0, |(total, max)| (max / (total + 1e-6)).min(1.0));
    let (ka, kb) = (coef(ca), coef(cb));
    if (ka < 1.0) == (kb < 1.0) {
        return None;
    }
    let r = fitted_ratio(x, y, cx.eps)?;
    let before = r * ka / kb;
    let side = if kb < 1.0 { &c.right } else { &c.left };
    let (total, max) = if kb < 1.0 { cb? } else { ca? };
    let whole = |v: f64| v >= 1.5 && (v - v.round()).abs() <= 1e-3 * v;
    let (reason, what) = match whole(before) || whole(1.0 / before) {
        true => (Reason::LossScaling, format!("exactly {before:.2}x before clipping: {}", loss_scaling_fix(cx))),
        false => (Reason::UniformFactor, format!("{before:.4}x before clipping")),
    };
    Some(Diagnosis {
        reason,
        detail: format!(
            "{} gradients are a uniform {r:.4}x {}'s at step {s}, and clipping ran on {side} only (norm {total:.4} \
             over max_norm {max}): {what}; clipping hides the factor, it does not remove it",
            c.right, c.left
        ),
    })
}

/// Runs that agree only because both clipped every step: the total norms before clipping
/// differ by one factor throughout (a loss divided twice, say). The applied gradients are
/// the same, so the verdict stands; once the norm falls under max_norm the runs part.
pub fn caution(a: &Trace, b: &Trace, c: &Comparison, cx: &Context) -> Option<Diagnosis> {
    if c.verdict == Verdict::Diverged {
        return None;
    }
    let n = a.clip_norms.len().min(b.clip_norms.len());
    let pairs: Option<Vec<_>> = (0..n)
        .map(|s| {
            let ((ta, ma), (tb, mb)) = (a.clip_norms[s]?, b.clip_norms[s]?);
            (ta > ma && tb > mb && ta > 0.0).then_some((ta, tb, ma))
        })
        .collect();
    let pairs = pairs.filter(|p| !p.is_empty())?;
    let (ta, tb, max) = pairs[0];
    let r = tb / ta;
    let steady = pairs.iter().all(|&(x, y, _)| ((y / x) / r - 1.0).abs() <= 1e-3);
    if !steady || (r - 1.0).abs() <= 1e-2 {
        return None;
    }
    let whole = |v: f64| v >= 1.5 && (v - v.round()).abs() <= 1e-3 * v;
    let fix = if whole(r) || whole(1.0 / r) { loss_scaling_fix(cx) } else { "a uniform factor".to_string() };
    Some(Diagnosis {
        reason: Reason::HiddenFactor,
        detail: format!(
            "clipping hid a {r:.4}x factor: {}'s total gradient norm before clipping was {r:.4}x {}'s at every one \
             of the {} steps (step 0: {tb:.4} vs {ta:.4}, max_norm {max}); both were clipped to the same gradients, \
             so the runs agree only while clipping is active and part once the norm falls under max_norm; {fix}",
            c.right,
            c.left,
            pairs.len()
        ),
    })
}

/// Accumulation vs the big batch. `runs_agree`: accumulation and DDP were found
/// equivalent, so a mismatch here is a mistake both make alike (a normalisation), not a
/// sampler's.
pub fn big_batch(a: &Trace, b: &Trace, c: &Comparison, cx: &Context, runs_agree: bool) -> Option<Diagnosis> {
    if c.verdict != Verdict::Diverged || c.left_steps != c.right_steps || !runs_agree {
        return cause(a, b, c, cx);
    }
    let s = c.steps.iter().position(|g| g.verdict == Verdict::Diverged)?;
    let (Some(xs), Some(ys)) = (a.steps.get(s), b.steps.get(s)) else { return cause(a, b, c, cx) };
    if let Some(d) = step_record(a, b, c, cx, s) {
        return Some(d);
    }
    if let Some(d) = user_dropout(a, b, c, s).filter(|_| !cx.ours) {
        return Some(d);
    }
    let (x, y) = (flat(xs), flat(ys));
    let ratio = fitted_ratio(&y, &x, cx.eps);
    let diagnosis = |reason: Reason, detail: String| Some(Diagnosis { reason, detail });
    match ratio {
        Some(r) if cx.first_short.is_some_and(|(i, f)| i == s && (r - f).abs() <= 1e-3 * f) => diagnosis(
            Reason::ShortWindowScaling,
            format!(
                "accumulation agrees with the big batch until step {s}, the short window at an epoch's end, whose \
                 gradient is {r:.3}x the big batch's: its loss is divided as if it held K micro-batches; divide by \
                 what the window holds (its micro-batches, or its tokens)"
            ),
        ),
        Some(r) if cx.token_loss => diagnosis(
            Reason::TokenCount,
            format!(
                "from step {s} accumulation's gradients are {r:.4}x the big batch's, one factor per step: the loss is \
                 divided by the wrong number of tokens; count the targets (labels != -100, after the causal shift) \
                 over every micro-batch of the step and every rank"
            ),
        ),
        Some(r) => diagnosis(
            Reason::LossScaling,
            format!(
                "from step {s} accumulation's gradients are {r:.3}x the big batch's, one factor per step: loss \
                 scaling (each micro-batch's loss must be divided by K, by K/W on each rank)"
            ),
        ),
        None if cx.token_loss || !cx.ours => diagnosis(
            Reason::PerMicroBatchMean,
            format!(
                "step {s} differs from the big batch by more than rounding and not by one factor, though DDP and \
                 accumulation agree: each micro-batch's loss is averaged over its own tokens (or samples) and then \
                 divided by K, so tokens of short micro-batches weigh more; sum the per-token losses and divide by \
                 the step's token count (over all micro-batches and ranks){}",
                if cx.ours {
                    ""
                } else {
                    " (Transformers PR 34191: pass num_items_in_batch on to the loss); or the loss couples the \
                     samples of a batch (a contrastive loss's in-batch negatives, BatchNorm's statistics), which one \
                     big batch computes over all of them: then DDP matches accumulation, not a larger batch, unless \
                     the ranks gather their samples"
                }
            ),
        ),
        None => cause(a, b, c, cx),
    }
}

/// What the runs recorded of step `s` besides its numbers, where it differs: how often they
/// clipped (`Trace::clips`), or which keys their dropout masks came from (when the plans put
/// the same samples in the step).
fn step_record(a: &Trace, b: &Trace, c: &Comparison, cx: &Context, s: usize) -> Option<Diagnosis> {
    let (l, r) = (&c.left, &c.right);
    if let (Some(m), Some(n)) = (a.clips.get(s), b.clips.get(s)) {
        if m != n {
            return Some(Diagnosis {
                reason: Reason::GradientClipping,
                detail: format!(
                    "{l} clipped its gradients {m} times in step {s} and {r} {n} times: clip once per step, on the \
                     accumulated and synchronised gradient right before optimizer.step(), not after every \
                     micro-batch's backward (which clips partial sums)"
                ),
            });
        }
    }
    // Other samples draw other masks too: only the same samples keyed otherwise is this.
    let (m, n) = (a.dropout_keys.get(s)?, b.dropout_keys.get(s)?);
    (m != n && cx.same_samples != Some(false)).then(|| Diagnosis {
        reason: Reason::DropoutMasks,
        detail: format!(
            "{l} and {r} drew step {s}'s dropout masks from different keys: masks must follow the samples \
             (seed, epoch, sample index, layer), not each rank's own counter or stream, or ranks repeat one \
             another's masks"
        ),
    })
}

/// A user's model that trains with dropout on (the recorder's `dropout` header): each run
/// draws its own masks, DDP's ranks from their own generators, so no two runs apply the same
/// gradients and nothing finer can be said of the difference.
fn user_dropout(a: &Trace, b: &Trace, c: &Comparison, s: usize) -> Option<Diagnosis> {
    let (label, layers) =
        [(&c.left, a), (&c.right, b)].into_iter().find_map(|(l, t)| Some((l, t.meta.get("dropout")?)))?;
    Some(Diagnosis {
        reason: Reason::DropoutMasks,
        detail: format!(
            "step {s} differs by more than rounding, and {label}'s model trains with dropout on ({layers}): each run \
             draws its own masks (DDP's ranks from their own random streams, the one process from one stream), so \
             the runs apply different gradients whatever else is right; check with dropout off (p=0 for the check) \
             to see the rest"
        ),
    })
}

/// y = r * x for one r of any size (see [`constant_ratio`] for the fit), r not 1.
fn fitted_ratio(x: &[f64], y: &[f64], eps: f64) -> Option<f64> {
    let (sxy, sxx) = x.iter().zip(y).fold((0.0, 0.0), |(sxy, sxx), (a, b)| (sxy + a * b, sxx + a * a));
    if sxx == 0.0 || x.len() != y.len() {
        return None;
    }
    let r = sxy / sxx;
    let peak = x.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let tol = slack(1e-4, eps, 4.0);
    let same = x.iter().zip(y).all(|(a, b)| (b - r * a).abs() <= tol * r.abs() * peak);
    (same && (r - 1.0).abs() > tol).then_some(r)
}

fn flat(p: &Params) -> Vec<f64> {
    p.iter()
        .flat_map(|(_, t)| Vec::<f64>::try_from(&t.to_kind(tch::Kind::Double).flatten(0, -1)).unwrap_or_default())
        .collect()
}

/// y = r * x for one r, with r = n or 1/n for a whole n >= 2: the fingerprint of dividing by
/// K, W or K/W in the wrong place. (Any two numbers have "a ratio"; a whole one from
/// different samples would be a coincidence.) r is fitted by least squares and every
/// residual measured at the largest |x|: a deep net's backward rescaled by a K that is no
/// power of two rounds every element anew, and elements that cancel lose their ratio.
fn constant_ratio(x: &[f64], y: &[f64], eps: f64) -> Option<f64> {
    let tol = slack(1e-4, eps, 4.0);
    let whole = |v: f64| v >= 1.5 && (v - v.round()).abs() <= tol * v;
    fitted_ratio(x, y, eps).filter(|&r| whole(r) || whole(1.0 / r))
}

/// Equal up to rounding: relative to each element, or to the largest one where a deep net's
/// gradients cancel to small values.
fn close(x: &[f64], y: &[f64], eps: f64) -> bool {
    let scale = x.iter().chain(y).fold(0.0f64, |m, v| m.max(v.abs()));
    let (rel, at_scale) = (slack(1e-5, eps, 4.0), slack(1e-6, eps, 2.0));
    x.len() == y.len()
        && x.iter().zip(y).all(|(a, b)| {
            let d = (a - b).abs();
            d <= rel * a.abs().max(b.abs()).max(1e-6) || d <= at_scale * scale
        })
}
