//! What rounding and the comparison itself explain: values that blew up, a deep net
//! amplifying rounding, a tolerance tighter than the arithmetic, and steps compared as they
//! came and not kept.

use crate::judge::diagnose::parting::{Numbers, Parting};
use crate::judge::diagnose::Evidence;
use crate::judge::{Agreement, Problem};

/// NaN or Inf in either run: nothing can be proven from it.
pub fn non_finite(ev: &Evidence) -> Option<Parting> {
    let c = ev.c;
    // The first problem found, when it is NaN or Inf (a missing tensor is line-up's to say).
    let p = c.steps.iter().chain([&c.finals]).flat_map(|g| &g.tensors).find_map(|t| t.problem.as_ref());
    let p = p.filter(|p| matches!(p, Problem::NonFinite { .. }))?;
    Some(Parting::new(ev.first, None, None, Numbers::NonFinite(p.clone())))
}

/// Our own free-running deep net whose first step agrees to rounding and whose first
/// differing step is still small: the signature of chaos, measured on our models (a wrong
/// split or scale shows at step 0; recorded facts are asked first). A user's runs are never
/// called chaos here: only a control run proves their rounding (`judge::control`).
pub fn chaos(ev: &Evidence) -> Option<Parting> {
    let (c, cx) = (ev.c, ev.cx);
    if !cx.ours() || !cx.chaos_possible || c.steps.first()?.verdict == Agreement::Diverged {
        return None;
    }
    let s = ev.first?;
    // Chaos starts from rounding and grows by orders of magnitude per step (measured about
    // 1e3 in float32); a step that jumps straight to a 1% difference is something else.
    if c.steps[s].max_rel > 1e-2 {
        return None;
    }
    let growth = c.steps.iter().take(s + 2).map(|g| g.max_rel).collect();
    Some(Parting::new(Some(s), None, None, Numbers::Chaos { growth }))
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
pub fn explicit_tolerance(ev: &Evidence) -> Option<Parting> {
    let (c, s) = (ev.c, ev.first?);
    let ulps = c.steps[s].max_ulps;
    if c.derived || ulps > rounding_ulps(ev.cx.eps) {
        return None;
    }
    let numbers = Numbers::ExplicitTolerance { ulps, allowed: c.tolerance.max_ulps };
    Some(Parting::new(Some(s), None, None, numbers))
}

/// Streamed: the gradients were compared as they came and not kept (only ours).
pub fn not_kept(ev: &Evidence) -> Option<Parting> {
    let s = ev.first?;
    if ev.grads().is_some() {
        return None;
    }
    Some(Parting::new(Some(s), Some(crate::judge::diagnose::Stage::LocalGradient), None, Numbers::NotKept))
}
