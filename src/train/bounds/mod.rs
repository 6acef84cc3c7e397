//! What rounding alone may make DDP's numbers differ by, element by element, gathered by
//! the accumulation run as it trains.
//!
//! **A control run, measured.** DDP computes the same mathematics as accumulation but
//! rounds differently in two places: each rank divides its losses by K/W instead of K (so
//! every backward operation rounds at another scale, unless W is a power of two, when the two
//! differ by an exact power of two), and the gradients are summed in another order (K/W per
//! rank, times 1/W, then an all-reduce of W partials). The control redoes DDP's arithmetic
//! inside the accumulation run from the same weights and micro-batches: each micro-batch's
//! gradient with DDP's loss divisor (a second backward through the same graph, or the
//! accumulation gradient times W where that is exact), summed into per-rank partials in the
//! rank's order, each times 1/W by the same operation the reducer uses, then added up. So
//! |accumulation − control| is the measured noise floor: the size of DDP's legitimate
//! rounding, element by element.
//!
//! **Higham's bound for what the control cannot replay:** the all-reduce's own summation
//! order. Both sums lie within γ(W−1)·Σ_r|partial_r| of the exact one, with
//! γ(n) = n·u/(1−n·u) and u the unit roundoff of the reduction's additions (float32 for
//! bfloat16/float16 on the host, which adds in float32 and rounds back once; rounding is
//! monotone, so there DDP's result lies between the two ends of that interval rounded).
//!
//! Each element may then differ by twice the farthest DDP's result can be from
//! accumulation's: |accumulation − control| plus that reach. DDP run correctly lands at
//! most halfway there. The bound then follows the optimizer (momentum
//! carries a step's difference on, SGD's own rounding adds to it) to the final weights.

use tch::{Kind, Tensor};

use super::host::{f64s, host};
use crate::error::Result;
use crate::evidence::Params;
use crate::spec::DeviceKind;
use crate::spec::{Dtype, Optimizer, TchKind, TrainConfig};

/// The factor between what rounding explains and what is allowed.
pub const HEADROOM: f64 = 2.0;
/// Ulps of a tensor's largest gradient every element of it may differ by from the big batch.
const CANCELLED_ULPS: f64 = 16.0;

pub struct Bounds {
    world: usize,
    /// DDP's micro-batch gradients are exactly W times accumulation's: no second backward.
    exact_scaling: bool,
    /// Unit roundoff of the all-reduce's additions.
    reduce_u: f64,
    /// The gradients' dtype; sums of subnormals round in absolute terms, by up to `tiny`.
    dtype: Dtype,
    tiny: f64,
    /// The dtype's smallest subnormal: where values are that small, rounding is absolute.
    subnormal: f64,
    u: f64,
    lr: f64,
    momentum: f64,
    weight_decay: f64,
    /// DDP restarts every step from accumulation's weights: weight differences do not carry.
    lockstep: bool,
    /// This window: the micro-batch count so far, each rank's partial sum (in the
    /// gradients' dtype, as DDP keeps it), and the control's total with Σ|partial/W|.
    position: usize,
    partials: Vec<Vec<Option<Tensor>>>,
    control: Vec<Option<Tensor>>,
    partial_mag: Vec<Option<Tensor>>,
    /// Across steps, per parameter: a bound on |momentum buffer|, on the difference of the
    /// two runs' momentum buffers, and on the difference of their weights.
    buf_mag: Vec<Option<Tensor>>,
    buf_err: Vec<Option<Tensor>>,
    weight_err: Vec<Option<Tensor>>,
    /// Under AdamW: its settings, and a bound tracker for DDP and one for the big batch.
    adamw: Option<(AdamWParams, Vec<AdamWTrack>)>,
    steps: u32,
    /// The big batch is made: this window's Σ|micro-batch gradient| per parameter, and the
    /// terms (samples, or token positions) its reductions add up.
    big: bool,
    micro_mag: Vec<Option<Tensor>>,
    rows: usize,
    /// Whether DDP's arithmetic, replayed by the control, met inf/NaN this window: float16
    /// overflows at W times accumulation's per-micro-batch values there.
    ddp_found_inf: bool,
}

mod big;
mod clip;
mod control;
mod sgd;

pub use crate::bounds::{AdamWParams, AdamWTrack};
pub use clip::Clip;

impl Bounds {
    pub fn new(cfg: &TrainConfig, params: usize) -> Self {
        let w = cfg.shape.gpus;
        let narrow = cfg.precision.dtype.is_narrow();
        // NCCL may round at every hop in the dtype itself; the host path (CPU ranks, or ranks
        // sharing GPUs) adds in float32 (float64 for float64) and rounds once.
        let host = cfg.run.device == DeviceKind::Cpu || cfg.run.shared_gpus.is_some();
        let reduce_u = match (host, narrow) {
            (true, true) => Dtype::Float32.unit_roundoff(),
            _ => cfg.precision.dtype.unit_roundoff(),
        };
        // bfloat16's gradients are summed in float32, whose subnormals are the finer.
        let tiny = match cfg.precision.dtype {
            Dtype::Bfloat16 => Dtype::Float32,
            d => d,
        }
        .smallest_subnormal();
        let none = || (0..params).map(|_| None).collect::<Vec<Option<Tensor>>>();
        Bounds {
            world: w,
            // float16's small gradients are subnormal, where scaling by W is not exact; so
            // are float16 autocast's, and its large ones may overflow at W times the scale.
            exact_scaling: w.is_power_of_two() && cfg.precision.dtype != Dtype::Float16 && !cfg.precision.amp.scaled(),
            reduce_u,
            dtype: cfg.precision.dtype,
            tiny: tiny * (cfg.shape.acc_steps + w) as f64,
            subnormal: tiny,
            u: cfg.precision.dtype.unit_roundoff(),
            lr: cfg.optim.lr,
            momentum: cfg.optim.momentum,
            weight_decay: cfg.optim.weight_decay,
            lockstep: cfg.run.lockstep,
            position: 0,
            partials: (0..w).map(|_| none()).collect(),
            control: none(),
            partial_mag: none(),
            buf_mag: none(),
            buf_err: none(),
            weight_err: none(),
            adamw: (cfg.optim.optimizer == Optimizer::AdamW).then(|| {
                let p = AdamWParams {
                    betas: cfg.optim.betas,
                    eps: cfg.optim.eps,
                    weight_decay: cfg.optim.weight_decay,
                    u: cfg.precision.dtype.unit_roundoff(),
                    lockstep: cfg.run.lockstep,
                };
                let runs = if cfg.with_big_batch() { 2 } else { 1 };
                (p, (0..runs).map(|_| AdamWTrack::new(params)).collect())
            }),
            steps: 0,
            big: cfg.with_big_batch(),
            micro_mag: none(),
            rows: 0,
            ddp_found_inf: false,
        }
    }
}

fn gamma(n: usize, u: f64) -> f64 {
    let nu = n as f64 * u;
    nu / (1.0 - nu).max(0.5)
}

/// The tensor to do bound arithmetic with: a float32 copy for the narrow dtypes (their
/// rounding and float16's range would distort the bound itself), else the tensor itself,
/// detached (callers never write into it).
fn work(t: &Tensor) -> Tensor {
    match Dtype::of_kind(t.kind()).is_some_and(Dtype::is_narrow) {
        true => t.detach().to_kind(Kind::Float),
        false => t.detach(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const U: f64 = 1.0 / (1u64 << 24) as f64;

    /// Higham's γ(n) = n·u / (1 − n·u), by hand.
    #[test]
    fn gamma_is_highams() {
        assert_eq!(gamma(0, U), 0.0);
        assert_eq!(gamma(1, U), U / (1.0 - U));
        assert_eq!(gamma(3, U), 3.0 * U / (1.0 - 3.0 * U));
    }

    /// float32 on two CPU ranks: each element may differ by HEADROOM · (|control −
    /// accumulation| + 2·γ(1)·Σ|partial|), plus the subnormal floor of K + W additions.
    #[test]
    fn the_allowance_is_twice_the_measured_gap_plus_the_reordered_sums_reach() {
        let b = Bounds::new(&TrainConfig::article(), 1);
        let tiny = f64::from(f32::from_bits(1)) * 4.0;
        let c = Tensor::from_slice(&[1.0f32, -2.0]);
        let g = Tensor::from_slice(&[1.0f32, -2.0 + 2f32.powi(-22)]);
        let mag = Tensor::from_slice(&[3.0f32, 4.0]);
        let got = Vec::<f64>::try_from(b.allowed(c, mag, &g).to_kind(Kind::Double)).unwrap();
        let reach = |m: f64| 2.0 * gamma(1, U) * m;
        let want = [HEADROOM * reach(3.0) + tiny, HEADROOM * (2f64.powi(-22) + reach(4.0)) + tiny];
        for (got, want) in got.iter().zip(want) {
            assert!((got - want).abs() <= 4.0 * U * want, "{got} vs {want}");
        }
    }

    /// A control that overflowed derives nothing: only the floor is allowed, never infinity.
    #[test]
    fn a_non_finite_control_allows_only_the_floor() {
        let b = Bounds::new(&TrainConfig::article(), 1);
        let c = Tensor::from_slice(&[f32::INFINITY, f32::NAN]);
        let got =
            Vec::<f64>::try_from(b.allowed(c, Tensor::from_slice(&[1.0f32, 1.0]), &Tensor::from_slice(&[0f32, 0.0])));
        assert!(got.unwrap().iter().all(|&a| a == f64::from(f32::from_bits(1)) * 4.0));
    }
}
