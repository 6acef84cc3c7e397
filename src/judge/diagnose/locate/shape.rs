//! The first differing step's shape: one factor between the runs' gradients (a loss divided
//! by K, W or K/W in the wrong place, or multiplied in one run only), and a factor clipping
//! put into one run.

use crate::evidence::Trace;
use crate::judge::diagnose::measure::factor::{fitted_ratio, is_whole, whole_at, NORM_REL};
use crate::judge::diagnose::measure::most_apart;
use crate::judge::diagnose::parting::{Numbers, Parting, Side};
use crate::judge::diagnose::{Evidence, Stage};
use crate::judge::Agreement;

/// The right run's gradients are one factor of the left's: whole (n or 1/n, the fingerprint
/// of dividing by K, W or K/W in the wrong place), or of any size.
pub fn one_factor(ev: &Evidence) -> Option<Parting> {
    let (s, (x, y)) = (ev.first?, ev.grads()?);
    let ratio = fitted_ratio(x, y, ev.cx.eps)?;
    let numbers = Numbers::OneFactor { ratio, whole: whole_at(ratio, ev.cx.eps), adam: ev.cx.adam_family };
    Some(Parting::new(Some(s), Some(Stage::Scaling), None, numbers))
}

/// A factor clipping put into one run's gradients: where the records say clipping ran on one
/// side only at the first differing step, the factor before clipping is what the loop did (a
/// whole one is loss scaling); else clipping itself scaled the same gradients differently.
pub fn clipped_factor(ev: &Evidence) -> Option<Parting> {
    let (s, (x, y)) = (ev.first?, ev.grads()?);
    let norms = |t: &Trace| t.facts.clip_norms.get(s).copied().flatten();
    let (ca, cb) = (norms(ev.a), norms(ev.b));
    let coef = |n: Option<(f64, f64)>| n.map_or(1.0, |(total, max)| (max / (total + 1e-6)).min(1.0));
    let (ka, kb) = (coef(ca), coef(cb));
    if (ka < 1.0) == (kb < 1.0) {
        return None;
    }
    let ratio = fitted_ratio(x, y, ev.cx.eps)?;
    let before = ratio * ka / kb;
    let (side, norm) = if kb < 1.0 { (Side::Right, cb?) } else { (Side::Left, ca?) };
    let numbers = Numbers::ClippedFactor { ratio, before, whole: is_whole(before, NORM_REL), norm };
    Some(Parting::new(Some(s), Some(Stage::Scaling), Some(side), numbers))
}

/// Nothing recorded and no shape explains the difference: the first differing step (else
/// the final weights) and its tensors that part most, for the user to look at. Never called
/// rounding here: that takes a control run's proof (`judge::control`).
pub fn unexplained(ev: &Evidence) -> Option<Parting> {
    if ev.first.is_none() && ev.c.finals.verdict != Agreement::Diverged {
        return None;
    }
    let (first, tensors) = most_apart(ev.c);
    let finals_exact = crate::judge::diagnose::recording_in_doubt(ev.c);
    Some(Parting::new(first, None, None, Numbers::Unexplained { tensors, control: None, finals_exact }))
}

/// Some tensors' gradients one factor of the other run's while every other tensor agrees: a
/// scaling of those tensors alone (a gradient hook, a per-parameter multiplier) by something
/// that differs between one process and W ranks.
pub fn tensor_factor(ev: &Evidence) -> Option<Parting> {
    let s = ev.first?;
    let step = ev.c.steps.get(s)?;
    let apart: Vec<&str> =
        step.tensors.iter().filter(|t| t.verdict == Agreement::Diverged).map(|t| t.name.as_str()).collect();
    if apart.is_empty() || apart.len() == step.tensors.len() {
        return None;
    }
    let values =
        |t: &crate::evidence::Trace, n: &str| t.steps.get(s)?.iter().find(|(m, _)| m == n).map(|(_, v)| v.to_f64());
    let ratios: Vec<f64> =
        apart.iter().map(|n| fitted_ratio(&values(ev.a, n)?, &values(ev.b, n)?, ev.cx.eps)).collect::<Option<_>>()?;
    let ratio = ratios[0];
    ratios.iter().all(|r| (r / ratio - 1.0).abs() <= NORM_REL).then(|| {
        let tensors = apart.iter().take(3).map(|n| n.to_string()).collect();
        let numbers = Numbers::TensorFactor { tensors, ratio, whole: whole_at(ratio, ev.cx.eps) };
        Parting::new(Some(s), Some(Stage::LocalGradient), None, numbers)
    })
}
