//! When two values count as the same: the fixed tolerance, and what the flags override.

use serde::{Deserialize, Serialize};

use super::{Dtype, TrainConfig};

/// When two float32 values count as the same. An element passes if any bound holds;
/// the absolute bound only matters for values near zero, so a 2x scaling bug never passes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Tolerance {
    pub max_ulps: u32,
    pub rtol: f64,
    pub atol: f64,
}

impl Default for Tolerance {
    /// Float32: a sum of W partial gradients in another order moves a few ulps at most.
    fn default() -> Self {
        Tolerance::for_run(Dtype::Float32, true)
    }
}

impl Tolerance {
    /// The largest |Δ| this tolerance lets an element measured at `at` differ by, where one
    /// ulp there is `ulp`: any of atol, rtol·at and max_ulps ulps (an element passes if any
    /// holds).
    pub fn allowance(&self, at: f64, ulp: f64) -> f64 {
        self.atol.max(self.rtol * at).max(f64::from(self.max_ulps) * ulp)
    }

    /// Every part of it `k` times as wide (a regrouped step: `judge::comparer`).
    pub fn times(&self, k: u32) -> Self {
        Tolerance {
            max_ulps: self.max_ulps.saturating_mul(k),
            rtol: self.rtol * f64::from(k),
            atol: self.atol * f64::from(k),
        }
    }

    /// Ulps count in the run's own precision.
    /// - float32: a reordered sum of partial gradients moves a few ulps.
    /// - float64 in lockstep, bfloat16 and float16: float32's bounds scaled by the ratio of
    ///   the epsilons (2^-29, 2^16, 2^13): the same reordering, rounded at another precision.
    /// - float64 free-running: deep BatchNorm nets amplify rounding from step to step (on
    ///   resnet-tiny a thousand-fold per step at 32x32 images, up to a million-fold with
    ///   3-sample micro-batches at 8x8: 1.3e-9 relative at step 1), so the bound is rel 1e-7,
    ///   good for about two steps, still ten times finer than float32's rounding; a real bug
    ///   (a scale, a stale or missing sample) moves gradients by 1e-3 or more at its first
    ///   step, 10^4 times the bound. Runs judged by derived bounds (`train::Bounds`) do not
    ///   use these numbers.
    pub fn for_run(dtype: Dtype, lockstep: bool) -> Self {
        match (dtype, lockstep) {
            (Dtype::Float32, _) => Tolerance { max_ulps: 16, rtol: 1e-6, atol: 1e-7 },
            (Dtype::Float64, true) => Tolerance { max_ulps: 16, rtol: 2e-15, atol: 2e-16 },
            (Dtype::Float64, false) => Tolerance { max_ulps: 16, rtol: 1e-7, atol: 1e-10 },
            (Dtype::Bfloat16 | Dtype::Float16, _) => {
                let f32 = Tolerance::for_run(Dtype::Float32, lockstep);
                let ratio = dtype.epsilon() / Dtype::Float32.epsilon();
                Tolerance { rtol: f32.rtol * ratio, atol: f32.atol * ratio, ..f32 }
            }
        }
    }
}

/// `--max-ulps/--rtol/--atol` as given. Without any of them each element is held to the
/// bound the arithmetic gives it (`train::Bounds`); any one given makes the fixed tolerance
/// decide instead, its other bounds at their defaults.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ToleranceOverrides {
    pub max_ulps: Option<u32>,
    pub rtol: Option<f64>,
    pub atol: Option<f64>,
}

impl ToleranceOverrides {
    pub fn given(&self) -> bool {
        self.max_ulps.is_some() || self.rtol.is_some() || self.atol.is_some()
    }

    /// The fixed tolerance: for goldens always, for the runs when overridden.
    pub fn tolerance(&self, dtype: Dtype, lockstep: bool) -> Tolerance {
        let d = Tolerance::for_run(dtype, lockstep);
        Tolerance {
            max_ulps: self.max_ulps.unwrap_or(d.max_ulps),
            rtol: self.rtol.unwrap_or(d.rtol),
            atol: self.atol.unwrap_or(d.atol),
        }
    }

    /// Whether accumulation vs DDP is judged by the derived bounds.
    pub fn derive(&self, train: &TrainConfig) -> bool {
        !self.given() && train.bounds_hold()
    }
}
