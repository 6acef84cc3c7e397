//! What a run announces as it trains, and who listens. A run drives its step plan and
//! announces each micro-batch's backward, each rescaling of `.grad` (an unscale, a clip of
//! partial sums), each optimizer step and the end. The accumulation run's [`Bounds`] listen
//! and derive from those events what the other runs may differ by; every other run listens
//! with [`Silent`], which only backpropagates. A new bound is a new listener, not a new
//! branch in the run.

use tch::Tensor;

use super::bounds::{Bounds, Clip};
use super::optim::Optimizer;
use super::MicroBatchLoss;
use crate::error::Result;
use crate::evidence::Params;

/// What the next comparisons may differ by: DDP's, and the big batch's (empty where the
/// listener derives nothing).
pub type Allowed = (Params, Params);

pub trait Listener {
    /// A micro-batch's loss: backpropagate `loss / divisor` (times the loss scale) into `.grad`.
    fn backward(&mut self, mb: &MicroBatchLoss) -> Result<()>;

    /// Every `.grad` was multiplied by `coef`.
    fn rescaled(&mut self, _coef: f64) {}

    /// Whether DDP's replayed arithmetic found inf or NaN in the step just unscaled.
    fn ddp_found_inf(&mut self) -> bool {
        false
    }

    /// The optimizer step about to be applied: its gradients before clipping (`None` when
    /// both loss scalers skip it), the weights, the learning rate and the clipping.
    fn step(
        &mut self,
        _names: &[String],
        _grads: Option<&[Tensor]>,
        _w: &[Tensor],
        _lr: f64,
        _c: Option<Clip>,
    ) -> Allowed {
        (Params::new(), Params::new())
    }

    /// The optimizer applied the step.
    fn stepped(&mut self, _weights: &[Tensor], _opt: &Optimizer) {}

    /// The end: what the final weights may differ by.
    fn finals(&self, _names: &[String], _weights: &[Tensor]) -> Allowed {
        (Params::new(), Params::new())
    }
}

/// A run that derives nothing: it only backpropagates, as PyTorch's loop does.
pub struct Silent;

impl Listener for Silent {
    fn backward(&mut self, mb: &MicroBatchLoss) -> Result<()> {
        // `loss / ACC_STEPS` with an integer divisor, as in the article; tiny-lm's summed
        // loss over the step's token count; times the loss scale under AMP.
        Ok(super::scaler::seed(mb.loss, mb.divisor, mb.scale).f_backward()?)
    }
}

impl Listener for Bounds {
    fn backward(&mut self, mb: &MicroBatchLoss) -> Result<()> {
        Bounds::backward(self, mb)
    }

    fn rescaled(&mut self, coef: f64) {
        self.rescale(coef);
    }

    fn ddp_found_inf(&mut self) -> bool {
        self.take_ddp_found_inf()
    }

    fn step(&mut self, names: &[String], grads: Option<&[Tensor]>, w: &[Tensor], lr: f64, c: Option<Clip>) -> Allowed {
        match grads {
            // Skipped by both runs: nothing applied, nothing carried.
            None => self.skip(names, w),
            Some(grads) => Bounds::step(self, names, grads, w, lr, c),
        }
    }

    fn stepped(&mut self, weights: &[Tensor], opt: &Optimizer) {
        self.after_step(weights, &opt.moments());
    }

    fn finals(&self, names: &[String], weights: &[Tensor]) -> Allowed {
        (Bounds::finals(self, names, weights), self.finals_big(names, weights))
    }
}
