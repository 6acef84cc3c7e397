//! What rounding and the comparison itself explain: values that blew up, runs that agree
//! step by step but not at the end, a deep net amplifying rounding, a tolerance tighter than
//! the arithmetic, and steps compared as they came and not kept.

use super::{Diagnosis, Evidence};
use crate::judge::{Agreement, Problem, Reason};

/// NaN or Inf in either run: nothing can be proven from it.
pub fn non_finite(ev: &Evidence) -> Option<Diagnosis> {
    let c = ev.c;
    // The first problem found, when it is NaN or Inf (a missing tensor is line-up's to say).
    let p = c.steps.iter().chain([&c.finals]).flat_map(|g| &g.tensors).find_map(|t| t.problem.as_ref());
    let p = p.filter(|p| matches!(p, Problem::NonFinite { .. }))?;
    Diagnosis::new(
        Reason::NonFinite,
        format!("{p}: training blew up (learning rate too high, or bad data); nothing can be proven from NaN or Inf"),
    )
}

/// Every step's gradients agree, yet the runs differ: in what the optimizer made of them,
/// or in the buffers.
pub fn after_the_gradients(ev: &Evidence) -> Option<Diagnosis> {
    let c = ev.c;
    if ev.first.is_some() {
        return None;
    }
    if c.finals.verdict != Agreement::Diverged {
        return Diagnosis::new(
            Reason::Buffers,
            "every gradient and final weight agrees but the buffers (BatchNorm's running statistics) \
             differ: DDP keeps rank 0's (broadcast_buffers), so compare runs of one kind, or leave buffers \
             out (no --strict-buffers)",
        );
    }
    let detail = match (ev.cx.ours(), c.derived) {
        (false, false) => {
            "every step's gradients agree within tolerance but the final weights do not: the \
             optimizer made different steps of the same gradients, or amplified their rounding (Adam \
             and AdamW divide by √v, so a parameter whose true gradient is zero, such as an attention \
             key bias, moves a full step on rounding noise); record with ddp_verify_trace.record() \
             or TraceRecorder(optimizer=...) so the bound is carried through the optimizer"
        }
        _ => {
            "every step's gradients agree but the final weights differ beyond what the optimizer makes of that \
             agreement: the runs' optimizers differ (their settings, their state, or a step applied to other \
             parameters)"
        }
    };
    Diagnosis::new(Reason::OptimizerStep, detail)
}

/// A free-running deep net whose first step agrees to rounding and whose first differing
/// step is still small: the signature of chaos, not of a bug (a wrong split or scale shows
/// at step 0; recorded facts are asked first).
pub fn chaos(ev: &Evidence) -> Option<Diagnosis> {
    let (c, cx) = (ev.c, ev.cx);
    if !cx.chaos_possible || c.steps.first()?.verdict == Agreement::Diverged {
        return None;
    }
    let s = ev.first?;
    // Chaos starts from rounding and grows by orders of magnitude per step (measured about
    // 1e3 in float32); a step that jumps straight to a 1% difference is something else.
    if c.steps[s].max_rel > 1e-2 {
        return None;
    }
    let growth: Vec<String> = c.steps.iter().take(s + 2).map(|g| format!("{:.0e}", g.max_rel)).collect();
    let fix = match cx.ours() {
        true => "rerun with --lockstep (the default) or --dtype float64 to prove equivalence",
        false => "record fewer steps, or train in float64, to prove equivalence",
    };
    Diagnosis::new(
        Reason::Chaos,
        format!(
            "step 0 agrees to rounding, then the difference grows step by step (max rel {}): a deep net amplifies \
             rounding, so equivalent free-running runs part like this; {fix}",
            growth.join(" -> ")
        ),
    )
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

/// A fixed tolerance tighter than rounding: the first differing step is off by a few ulps.
pub fn explicit_tolerance(ev: &Evidence) -> Option<Diagnosis> {
    let (c, s) = (ev.c, ev.first?);
    let ulps = c.steps[s].max_ulps;
    if c.derived || ulps > rounding_ulps(ev.cx.eps) {
        return None;
    }
    let (which, fix) = match ev.cx.ours() {
        true => ("explicit", "drop --max-ulps/--rtol/--atol to judge by the bound derived from it"),
        false => (
            "fixed",
            "record micro-batch magnitudes per element (record(magnitudes=\"element\"), \
             DDP_VERIFY_MAGNITUDES=element) or pass a looser --max-ulps/--rtol",
        ),
    };
    Diagnosis::new(
        Reason::ExplicitTolerance,
        format!(
            "step {s} differs by only {ulps} ulp, which floating-point rounding explains (e.g. the order W partial \
             gradients are summed in); the {which} tolerance ({} ulp) is tighter than the arithmetic allows: {fix}",
            c.tolerance.max_ulps
        ),
    )
}

/// Streamed: the gradients were compared as they came and not kept (only ours).
pub fn not_kept(ev: &Evidence) -> Option<Diagnosis> {
    let s = ev.first?;
    if ev.grads().is_some() {
        return None;
    }
    Diagnosis::new(
        Reason::DifferentGradients,
        format!("step {s}'s gradients differ by more than rounding (rerun with --save-trace to inspect them)"),
    )
}
