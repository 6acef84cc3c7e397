//! Numbers the locators measure from recorded facts and gradients, shared by every family:
//! one factor and whether it is whole (`factor`), one leg's stage facts at a step (`legs`).
//! No words here, and no owner.

pub mod factor;
pub mod legs;

pub use legs::scales_inside;

use crate::evidence::Framework;
use crate::judge::{Agreement, Comparison};

/// Of two factors (scalings, divides), which are ratios of recorded values: how near they must
/// be to be one.
pub const FACTOR_REL: f64 = 2e-3;

/// Two values equal to within `rel` of the larger.
pub fn near(x: f64, y: f64, rel: f64) -> bool {
    (x - y).abs() <= rel * x.abs().max(y.abs()).max(f64::MIN_POSITIVE)
}

/// Where two runs part most: the first differing step's (else the final weights')
/// diverged tensors, the three that used most of their allowance, with that fraction.
pub fn most_apart(c: &Comparison) -> (Option<usize>, Vec<(String, f64)>) {
    let first = c.steps.iter().position(|s| s.verdict == Agreement::Diverged);
    let group = first.map_or(&c.finals, |s| &c.steps[s]);
    let mut tensors: Vec<(String, f64)> = group
        .tensors
        .iter()
        .filter(|t| t.verdict == Agreement::Diverged)
        .map(|t| (t.name.clone(), t.worst_fraction))
        .collect();
    tensors.sort_by(|x, y| y.1.total_cmp(&x.1));
    tensors.truncate(3);
    (first, tensors)
}

/// The median of some values (None where there are none).
pub fn median(mut v: Vec<f64>) -> Option<f64> {
    v.retain(|x| x.is_finite());
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

/// Whether `f` divides each micro-batch's loss by its accumulation steps itself (Lightning's
/// Trainer, Accelerate's backward under accumulate(), Transformers' Trainer, DeepSpeed's
/// engine.backward); `advise` names the setting that does it.
pub fn divides_loss(f: Framework) -> bool {
    match f {
        Framework::Lightning | Framework::Accelerate | Framework::Transformers | Framework::DeepSpeed => true,
        Framework::Plain | Framework::ColossalAi => false,
    }
}
