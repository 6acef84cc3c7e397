//! Numbers the locators measure from recorded facts and gradients, shared by every family:
//! one factor and whether it is whole (`factor`), one leg's stage facts at a step (`legs`).
//! No words here, and no owner.

pub mod factor;
pub mod legs;

use crate::evidence::Framework;

/// Of two factors (scalings, divides), which are ratios of recorded values: how near they must
/// be to be one.
pub const FACTOR_REL: f64 = 2e-3;

/// Two values equal to within `rel` of the larger.
pub fn near(x: f64, y: f64, rel: f64) -> bool {
    (x - y).abs() <= rel * x.abs().max(y.abs()).max(f64::MIN_POSITIVE)
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
