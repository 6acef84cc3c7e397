//! Clipping: how often each step clipped, a factor one run's clipping put into its
//! gradients, and a factor both runs' clipping hides (a caution beside EQUIVALENT).

use super::factor::{fitted_ratio, is_whole, NORM_REL};
use super::scaling::loss_scaling_fix;
use super::{Diagnosis, Evidence};
use crate::evidence::Trace;
use crate::judge::{Agreement, Comparison, Reason};

/// The runs clipped a different number of times in the first differing step.
pub fn clip_count(ev: &Evidence) -> Option<Diagnosis> {
    let s = ev.first?;
    let (m, n) = (ev.a.facts.clips.get(s)?, ev.b.facts.clips.get(s)?);
    (m != n).then(|| Diagnosis {
        reason: Reason::GradientClipping,
        located: None,
        detail: format!(
            "{} clipped its gradients {m} times in step {s} and {} {n} times: clip once per step, on the \
             accumulated and synchronised gradient right before optimizer.step(), not after every \
             micro-batch's backward (which clips partial sums)",
            ev.left(),
            ev.right()
        ),
    })
}

/// A factor clipping put into one run's gradients: where the records say clipping ran on one
/// side only at the first differing step, the factor before clipping is what the loop did (a
/// whole one is loss scaling); else clipping itself scaled the same gradients differently.
pub fn clipped_factor(ev: &Evidence) -> Option<Diagnosis> {
    let (s, (x, y)) = (ev.first?, ev.grads()?);
    let norms = |t: &Trace| t.facts.clip_norms.get(s).copied().flatten();
    let (ca, cb) = (norms(ev.a), norms(ev.b));
    let coef = |n: Option<(f64, f64)>| n.map_or(1.0, |(total, max)| (max / (total + 1e-6)).min(1.0));
    let (ka, kb) = (coef(ca), coef(cb));
    if (ka < 1.0) == (kb < 1.0) {
        return None;
    }
    let r = fitted_ratio(x, y, ev.cx.eps)?;
    let before = r * ka / kb;
    let side = if kb < 1.0 { ev.right() } else { ev.left() };
    let (total, max) = if kb < 1.0 { cb? } else { ca? };
    let (reason, what) = match is_whole(before, NORM_REL) {
        true => (Reason::LossScaling, format!("exactly {before:.2}x before clipping: {}", loss_scaling_fix(ev.cx))),
        false => (Reason::UniformFactor, format!("{before:.4}x before clipping")),
    };
    Diagnosis::new(
        reason,
        format!(
            "{} gradients are a uniform {r:.4}x {}'s at step {s}, and clipping ran on {side} only (norm {total:.4} \
             over max_norm {max}): {what}; clipping hides the factor, it does not remove it",
            ev.right(),
            ev.left()
        ),
    )
}

/// Runs that agree only because both clipped every step: the total norms before clipping
/// differ by one factor throughout (a loss divided twice, say). The applied gradients are
/// the same, so the verdict stands; once the norm falls under max_norm the runs part.
pub fn caution(a: &Trace, b: &Trace, c: &Comparison, cx: &super::Context) -> Option<Diagnosis> {
    if c.verdict == Agreement::Diverged {
        return None;
    }
    let (na, nb) = (&a.facts.clip_norms, &b.facts.clip_norms);
    let pairs: Option<Vec<_>> = (0..na.len().min(nb.len()))
        .map(|s| {
            let ((ta, ma), (tb, mb)) = (na[s]?, nb[s]?);
            (ta > ma && tb > mb && ta > 0.0).then_some((ta, tb, ma))
        })
        .collect();
    let pairs = pairs.filter(|p| !p.is_empty())?;
    let (ta, tb, max) = pairs[0];
    let r = tb / ta;
    let steady = pairs.iter().all(|&(x, y, _)| ((y / x) / r - 1.0).abs() <= NORM_REL);
    if !steady || (r - 1.0).abs() <= 1e-2 {
        return None;
    }
    let fix = if is_whole(r, NORM_REL) { loss_scaling_fix(cx) } else { "a uniform factor".to_string() };
    Diagnosis::new(
        Reason::HiddenFactor,
        format!(
            "clipping hid a {r:.4}x factor: {}'s total gradient norm before clipping was {r:.4}x {}'s at every one \
             of the {} steps (step 0: {tb:.4} vs {ta:.4}, max_norm {max}); both were clipped to the same gradients, \
             so the runs agree only while clipping is active and part once the norm falls under max_norm; {fix}",
            c.right,
            c.left,
            pairs.len()
        ),
    )
}
