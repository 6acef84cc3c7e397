//! What clipping does to the bounds: the coefficient's own uncertainty and rounding.

use tch::{Kind, Tensor};

use super::*;

/// The accumulation run's clipping of one step: `max_norm`, its gradient's total norm, and
/// the coefficient it multiplied every gradient by.
#[derive(Clone, Copy, Debug)]
pub struct Clip {
    pub max: f64,
    pub total: f64,
    pub coef: f64,
}

impl Bounds {
    /// Clipping multiplies every gradient by one coefficient, which each run computes from
    /// its own total norm: the totals differ by at most the allowance's 2-norm (the norm is
    /// 1-Lipschitz) plus each run's rounding of it (a cascaded sum of squares of n terms,
    /// within γ(⌈log₂ n⌉ + 32) of the exact one in the accumulating precision, then one
    /// rounding to the dtype), so the coefficients by at most what
    /// min(1, max / (x + 1e-6)) moves over that interval, plus their own rounding. Each
    /// element's allowance becomes coef·a + HEADROOM·(|g|·Δcoef + the product's rounding).
    pub(super) fn clipped(&self, allowed: &mut [Tensor], grads: &[Tensor], c: Clip) {
        let n: i64 = grads.iter().map(|g| g.numel() as i64).sum();
        let depth = (n.max(1) as f64).log2().ceil() as usize + (grads.len().max(1) as f64).log2().ceil() as usize + 32;
        let spread: f64 = allowed.iter().map(|a| a.square().sum(Kind::Double).double_value(&[])).sum::<f64>().sqrt();
        // ATen accumulates a narrow dtype's norm in float32 and rounds the result once.
        let acc_u = if self.dtype.is_narrow() { Dtype::Float32.unit_roundoff() } else { self.u };
        let d = spread + 2.0 * (gamma(depth, acc_u) + self.u) * c.total;
        let f = |x: f64| (c.max / (x.max(0.0) + 1e-6)).min(1.0);
        // The coefficient's three roundings in each run: relative, or half a subnormal
        // spacing each where it is that small (float16: a coefficient under 6e-5).
        let dcoef = f(c.total - d) - f(c.total + d) + 6.0 * (self.u * c.coef + self.subnormal);
        for (a, g) in allowed.iter_mut().zip(grads) {
            let g = g.abs();
            // `a` holds HEADROOM already; what clipping's rounding adds gets it too.
            *a = &*a * c.coef + (&g * dcoef + g * (c.coef * 2.0 * self.u) + 2.0 * self.subnormal) * HEADROOM;
        }
    }
}
