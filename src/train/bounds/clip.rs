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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// torch.nn.utils.clip_grad_norm_ on float32 vectors: the total 2-norm, the coefficient
    /// clamped to 1, every gradient times it.
    fn clip(g: &[f32], max: f32) -> (f32, f32, Vec<f32>) {
        let total = g.iter().map(|x| x * x).sum::<f32>().sqrt();
        let coef = (max / (total + 1e-6)).min(1.0);
        (total, coef, g.iter().map(|x| x * coef).collect())
    }

    /// Nothing is clipped (coef 1) and nothing allowed beyond the floor: the allowance is
    /// unchanged but for the product's rounding, by hand coef·a + 2·(2u·|g| + 2·subnormal).
    #[test]
    fn an_inactive_clip_keeps_the_allowance_and_adds_the_products_rounding() {
        let b = Bounds::new(&TrainConfig::article(), 1);
        let g = Tensor::from_slice(&[3.0f32, -4.0]);
        let mut a = vec![Tensor::from_slice(&[1e-6f32, 2e-6])];
        b.clipped(&mut a, &[g], Clip { max: 1e6, total: 5.0, coef: 1.0 });
        let got = Vec::<f64>::try_from(a[0].to_kind(Kind::Double)).unwrap();
        let (u, sub) = (b.u, b.subnormal);
        for (got, (a, g)) in got.iter().zip([(1e-6f32, 3.0), (2e-6, 4.0)]) {
            let dcoef = 6.0 * (u + sub);
            let want = f64::from(a) + HEADROOM * (g * dcoef + g * 2.0 * u + 2.0 * sub);
            assert!((got - want).abs() <= 1e-3 * want, "{got} vs {want}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// Soundness: two float32 gradients within the allowance of each other stay within
        /// the clipped allowance after each run clips by its own norm, active or not.
        #[test]
        fn two_clipped_gradients_stay_within_the_clipped_allowance(
            parts in proptest::collection::vec((-2.0f32..2.0, 1e-7f32..1e-3, -1.0f32..1.0), 1..16),
            max in prop_oneof![Just(0.1f32), Just(1.0), Just(100.0)],
        ) {
            let b = Bounds::new(&TrainConfig::article(), 1);
            let g: Vec<f32> = parts.iter().map(|p| p.0).collect();
            let g2: Vec<f32> = parts.iter().map(|p| p.0 + p.1 * p.2).collect();
            let allowed: Vec<f32> = parts.iter().map(|p| p.1).collect();
            let (total, coef, ca) = clip(&g, max);
            let (_, _, cb) = clip(&g2, max);
            let mut a = vec![Tensor::from_slice(&allowed)];
            let clip = Clip { max: f64::from(max), total: f64::from(total), coef: f64::from(coef) };
            b.clipped(&mut a, &[Tensor::from_slice(&g)], clip);
            let a = Vec::<f64>::try_from(a[0].to_kind(Kind::Double)).unwrap();
            for ((x, y), a) in ca.iter().zip(&cb).zip(a) {
                prop_assert!(f64::from((x - y).abs()) <= a, "{x} vs {y}: allowed {a}");
            }
        }
    }
}
