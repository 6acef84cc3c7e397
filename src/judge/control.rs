//! Rounding proven, not assumed. A user's runs train on their own, so from step 1 each
//! step's gradients are taken at weights already apart by the earlier steps' rounding, which
//! one step's tolerance cannot allow for; and a bug that moves a gradient a little looks the
//! same. Where runs that agree at step 0 part later with no recorded fact apart (or part
//! only in final weights no bound is carried to), this model's own amplification of
//! rounding is measured: a control run, the accumulation leg again with each step's
//! gradients nudged by about what the reduction order changed at step 0 (`PERTURB_ENV`).
//! The runs are equivalent only while DDP stays within [`MARGIN`] times the control's
//! distance from accumulation, step by step and in the final weights; otherwise they are
//! not, from the step where DDP left rounding's path. Equivalent runs and clear bugs never
//! pay for the control: it runs only in that ambiguous case.

use super::diagnose::{ControlPath, Diagnosis, Numbers, Reason, Tier};
use super::{Agreement, Comparison};
use crate::evidence::{Params, Trace};

/// How far DDP may part from accumulation, as a multiple of the control's distance (or of
/// the nudge, where the control parts less). The control's nudge is at least DDP's step-0
/// difference in every element (uniform up to the largest element's), so under the linear
/// growth of differences this small the control parts at least as far as rounding does, on
/// average; the margin covers the spread of a largest element between two draws of noise
/// (measured on honest runs, docs/own-loop.md "Rounding proven by a control run").
pub const MARGIN: f64 = 4.0;

/// A control whose step-0 distance exceeds its nudge by more than this did not repeat the
/// run it nudged (unseeded randomness): it proves nothing.
const REPEATS: f64 = 2.0;

/// Tiers whose partings only suggest (rounding, shapes, the walk's stage in the script read
/// at weights rounding already parted): a fact decides without a control.
fn inferred(t: Tier) -> bool {
    t >= Tier::Rounding
}

/// The nudge a control run needs before `runs` can be judged, or None where the judgement
/// stands without one: a user's runs that agree at step 0, part later (or only in final
/// weights held to no carried bound, `finals_unbounded`), with nothing but an inference
/// naming why.
pub fn wanted(
    d: Option<&Diagnosis>,
    runs: &Comparison,
    acc: &Trace,
    ddp: &Trace,
    finals_unbounded: bool,
    eps: f64,
) -> Option<f64> {
    let d = d?;
    let diverged = |v: Agreement| v == Agreement::Diverged;
    if !diverged(runs.verdict)
        || runs.left_steps != runs.right_steps
        || runs.steps.first().is_some_and(|s| diverged(s.verdict))
    {
        return None;
    }
    let gradients_apart = runs.steps.iter().any(|s| diverged(s.verdict));
    let ambiguous = match d.tier {
        Some(t) if inferred(t) => true,
        Some(Tier::AfterGradients) => !gradients_apart && finals_unbounded && d.reason == Reason::OptimizerStep,
        _ => false,
    };
    ambiguous.then(|| nudge(acc, ddp, eps))
}

/// What the control nudges by: DDP's step-0 distance from accumulation (at least an
/// epsilon), to two significant digits, rounded up.
fn nudge(acc: &Trace, ddp: &Trace, eps: f64) -> f64 {
    let none = Params::new();
    let d0 = distance(acc.steps.first().unwrap_or(&none), ddp.steps.first().unwrap_or(&none)).0.max(eps);
    let unit = 10f64.powf(d0.log10().floor() - 1.0);
    (d0 / unit).ceil() * unit
}

/// How far `b` is from `a`: per tensor max|Δ| over the larger max|value| of the two (a
/// tensor of zeros in both is not apart), the largest over tensors, and that tensor's name.
fn distance(a: &Params, b: &Params) -> (f64, String) {
    let mut worst = (0.0, String::new());
    for (name, x) in a {
        let Some((_, y)) = b.iter().find(|(n, _)| n == name) else { continue };
        let (x, y) = (x.to_f64(), y.to_f64());
        if x.len() != y.len() {
            continue;
        }
        let top = x.iter().chain(&y).fold(0.0f64, |m, v| m.max(v.abs()));
        let apart = x.iter().zip(&y).fold(0.0f64, |m, (p, q)| m.max((p - q).abs()));
        let d = if top > 0.0 { apart / top } else { 0.0 };
        if d > worst.0 {
            worst = (d, name.clone());
        }
    }
    worst
}

/// What the control says of the runs.
pub enum Proof {
    /// DDP stayed within the margin of the control throughout.
    Rounding(Numbers),
    /// DDP left rounding's path at `step` (None: in the final weights).
    Left { step: Option<usize>, path: ControlPath },
}

/// Holds DDP (`ddp`) to the control (`control`), both against accumulation (`acc`), where
/// `runs` found them apart.
pub fn prove(acc: &Trace, ddp: &Trace, control: &Trace, runs: &Comparison) -> Proof {
    let not_a_control = |why: String| Proof::Left { step: None, path: ControlPath::NotAControl(why) };
    let Some(scale) = control.header.perturbed else {
        return not_a_control("the control run was not nudged (its recorder could not reach the gradients)".into());
    };
    if control.steps.len() != acc.steps.len() {
        return not_a_control(format!(
            "the control run made {} optimizer steps where accumulation made {}",
            control.steps.len(),
            acc.steps.len()
        ));
    }
    let none = Params::new();
    fn at<'t>(t: &'t Trace, s: usize, none: &'t Params) -> &'t Params {
        t.steps.get(s).unwrap_or(none)
    }
    let (mut ddp_path, mut control_path) = (Vec::new(), Vec::new());
    for s in 0..acc.steps.len() {
        let (d, c) =
            (distance(at(acc, s, &none), at(ddp, s, &none)).0, distance(at(acc, s, &none), at(control, s, &none)).0);
        // Sampled traces measure at the kept elements, whose largest is below the tensor's
        // the nudge was scaled by: DDP and the control are still measured alike there.
        if s == 0 && acc.sampling.is_none() && c > REPEATS * scale {
            return not_a_control(format!(
                "it parted from accumulation by {c:.1e} at step 0, where its nudge was {scale:.1e}: the accumulation \
                 leg does not repeat itself (unseeded randomness, or nondeterministic kernels)"
            ));
        }
        let apart = runs.steps.get(s).is_some_and(|g| g.verdict == Agreement::Diverged);
        if s > 0 && apart && d > MARGIN * c.max(scale) {
            return Proof::Left { step: Some(s), path: ControlPath::Left { ddp: d, control: c, margin: MARGIN } };
        }
        ddp_path.push(d);
        control_path.push(c);
    }
    // The final weights, tensor by tensor where the runs' were found apart.
    let mut finals = (0.0f64, 0.0f64);
    for t in runs.finals.tensors.iter() {
        let one = |tr: &Trace| tr.finals.iter().filter(|(n, _)| *n == t.name).cloned().collect::<Params>();
        let (a, d, c) = (one(acc), one(ddp), one(control));
        let (dd, cc) = (distance(&a, &d).0, distance(&a, &c).0);
        if t.verdict == Agreement::Diverged && dd > MARGIN * cc.max(scale) {
            return Proof::Left { step: None, path: ControlPath::Left { ddp: dd, control: cc, margin: MARGIN } };
        }
        finals = (finals.0.max(dd), finals.1.max(cc));
    }
    ddp_path.push(finals.0);
    control_path.push(finals.1);
    Proof::Rounding(Numbers::AmplifiedRounding { ddp: ddp_path, control: control_path, margin: MARGIN, scale })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evidence::Values;

    fn params(v: &[f32]) -> Params {
        vec![("w".into(), Values::f32s(v.to_vec()))]
    }

    #[test]
    fn distance_is_relative_to_the_tensors_largest_value() {
        let (d, name) = distance(&params(&[2.0, 0.0]), &params(&[2.0, 0.5]));
        assert_eq!((d, name.as_str()), (0.25, "w"));
        assert_eq!(distance(&params(&[0.0]), &params(&[0.0])).0, 0.0);
    }

    #[test]
    fn the_nudge_is_step_0s_distance_rounded_up_and_at_least_epsilon() {
        let t = |g: &[f32]| Trace { steps: vec![params(g)], ..Trace::default() };
        // Two float32 epsilons apart at 1: 2.38e-7, rounded up to 2.4e-7.
        let n = nudge(&t(&[1.0, 1.0]), &t(&[1.0, 1.0 + 2.0 * f32::EPSILON]), 1.19e-7);
        assert!((n - 2.4e-7).abs() < 1e-15, "{n}");
        assert_eq!(nudge(&t(&[1.0]), &t(&[1.0]), 1e-7), 1e-7);
    }
}
