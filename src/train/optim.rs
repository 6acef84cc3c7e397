//! SGD with momentum, with PyTorch's exact arithmetic.
//!
//! `torch.optim.SGD` on CPU updates with `buf.mul_(m).add_(g)` then `p.add_(buf, alpha=-lr)`,
//! and `add_` with an alpha is a fused multiply-add in ATen. tch's tensor API cannot pass
//! alpha, so a hand-written step would round differently; libtorch's own C++
//! `torch::optim::SGD` runs the same ops, so we drive that one.

use tch::{COptimizer, Tensor};

use crate::error::Result;

pub struct Sgd {
    inner: COptimizer,
}

impl Sgd {
    /// `weight_decay` adds `wd * p` to each gradient before momentum, as PyTorch does.
    pub fn new(params: &[Tensor], lr: f64, momentum: f64, weight_decay: f64) -> Result<Self> {
        let mut inner = COptimizer::sgd(lr, momentum, 0.0, weight_decay, false)?;
        for p in params {
            inner.add_parameters(p, 0)?;
        }
        Ok(Sgd { inner })
    }

    pub fn step(&mut self) -> Result<()> {
        Ok(self.inner.step()?)
    }

    /// Sets gradients to None, as `optimizer.zero_grad()` does by default.
    pub fn zero_grad(&mut self) -> Result<()> {
        Ok(self.inner.zero_grad()?)
    }
}
