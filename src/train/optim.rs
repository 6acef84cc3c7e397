//! The optimizer step with PyTorch's exact arithmetic: SGD, AdamW, and gradient clipping.
//!
//! `torch.optim.SGD` on CPU updates with `buf.mul_(m).add_(g)` then `p.add_(buf, alpha=-lr)`,
//! and `add_` with an alpha is a fused multiply-add in ATen. tch's tensor API cannot pass
//! alpha, so a hand-written step would round differently; libtorch's own C++
//! `torch::optim::SGD` runs the same ops, so we drive that one.
//!
//! AdamW is written here, op for op as `torch.optim.AdamW(foreach=False)` runs it on CPU:
//! libtorch's C++ AdamW rounds otherwise (`mul_`+`add_` where Python has `lerp_`) and tch
//! does not expose its moments, which the runs compare. `addcmul_`/`addcdiv_` take no
//! `value` in tch, so the value is applied to their first factor beforehand: the kernels
//! compute `self + (value·t1)·t2` and `self + (value·t1)/t2`, and `value·t1` rounds the
//! same as a separate `mul` by that scalar, so the results are bit-identical (checked
//! against torch in `tests/it/sgd.rs`).

use tch::{COptimizer, Kind, Tensor};

use crate::error::Result;
use crate::spec::{OptimConfig, Optimizer as Kind_, TrainConfig};

pub struct Optimizer {
    /// libtorch's SGD: steps under SGD, and under AdamW only sets gradients to None
    /// (`zero_grad(set_to_none=True)`, as `optimizer.zero_grad()` does).
    sgd: COptimizer,
    adamw: Option<AdamW>,
    /// Each parameter's name and tensor.
    params: Vec<(String, Tensor)>,
}

struct AdamW {
    betas: (f64, f64),
    eps: f64,
    weight_decay: f64,
    lr: f64,
    /// Optimizer steps taken (each parameter's `state["step"]`).
    step: u32,
    /// exp_avg and exp_avg_sq per parameter, created at its first step as torch does.
    moments: Vec<Option<(Tensor, Tensor)>>,
}

impl Optimizer {
    /// `weight_decay`: SGD adds `wd · p` to each gradient before momentum; AdamW scales each
    /// weight by `1 − lr · wd` first (decoupled), as PyTorch does.
    pub fn new(cfg: &TrainConfig, params: &[(String, Tensor)]) -> Result<Self> {
        let OptimConfig { optimizer, betas, eps, .. } = cfg.optim;
        let mut sgd = COptimizer::sgd(cfg.optim.lr, cfg.optim.momentum, 0.0, cfg.optim.weight_decay, false)?;
        for (_, p) in params {
            sgd.add_parameters(p, 0)?;
        }
        let adamw = (optimizer == Kind_::AdamW).then(|| AdamW {
            betas,
            eps,
            weight_decay: cfg.optim.weight_decay,
            lr: cfg.optim.lr,
            step: 0,
            moments: params.iter().map(|_| None).collect(),
        });
        let params = params.iter().map(|(n, p)| (n.clone(), p.shallow_clone())).collect();
        Ok(Optimizer { sgd, adamw, params })
    }

    /// The learning rate of the next step (the schedule's).
    pub fn set_lr(&mut self, lr: f64) -> Result<()> {
        match &mut self.adamw {
            Some(a) => a.lr = lr,
            None => self.sgd.set_learning_rate(lr)?,
        }
        Ok(())
    }

    pub fn step(&mut self) -> Result<()> {
        match &mut self.adamw {
            Some(a) => tch::no_grad(|| a.step(&self.params)),
            None => Ok(self.sgd.step()?),
        }
    }

    /// Sets gradients to None, as `optimizer.zero_grad()` does by default.
    pub fn zero_grad(&mut self) -> Result<()> {
        Ok(self.sgd.zero_grad()?)
    }

    /// AdamW's moments, as `exp_avg.<param>` and `exp_avg_sq.<param>` (PyTorch's state
    /// keys); empty under SGD, whose momentum buffers libtorch keeps to itself.
    pub fn state(&self) -> Vec<(String, Tensor)> {
        let Some(a) = &self.adamw else { return Vec::new() };
        let mut out = Vec::new();
        for ((name, _), m) in self.params.iter().zip(&a.moments) {
            if let Some((m, v)) = m {
                out.push((format!("exp_avg.{name}"), m.shallow_clone()));
                out.push((format!("exp_avg_sq.{name}"), v.shallow_clone()));
            }
        }
        out
    }

    /// (exp_avg, exp_avg_sq) per parameter once it has stepped, for the bounds.
    pub fn moments(&self) -> Vec<Option<(Tensor, Tensor)>> {
        match &self.adamw {
            Some(a) => {
                a.moments.iter().map(|m| m.as_ref().map(|(m, v)| (m.shallow_clone(), v.shallow_clone()))).collect()
            }
            None => Vec::new(),
        }
    }
}

impl AdamW {
    /// `_single_tensor_adam` with `decoupled_weight_decay=True`, for each parameter that
    /// has a gradient.
    fn step(&mut self, params: &[(String, Tensor)]) -> Result<()> {
        let (b1, b2) = self.betas;
        self.step += 1;
        let t = self.step as f64;
        // Python floats: `1 - beta1 ** step`, `lr / bc1`, `bc2 ** 0.5`.
        let bias_correction1 = 1.0 - b1.powf(t);
        let bias_correction2 = 1.0 - b2.powf(t);
        let step_size = self.lr / bias_correction1;
        let bias_correction2_sqrt = bias_correction2.powf(0.5);
        for ((_, p), moments) in params.iter().zip(&mut self.moments) {
            let g = p.grad();
            if !g.defined() {
                continue;
            }
            let mut p = p.shallow_clone();
            let (m, v) = moments.get_or_insert_with(|| (p.zeros_like(), p.zeros_like()));
            if self.weight_decay != 0.0 {
                let _ = p.f_mul_scalar_(1.0 - self.lr * self.weight_decay)?;
            }
            let _ = m.f_lerp_(&g, 1.0 - b1)?;
            let _ = v.f_mul_scalar_(b2)?;
            let _ = v.f_addcmul_(&g.f_mul_scalar(1.0 - b2)?, &g)?;
            let mut denom = v.f_sqrt()?.f_div_scalar(bias_correction2_sqrt)?;
            let _ = denom.f_add_scalar_(self.eps)?;
            let _ = p.f_addcdiv_(&m.f_mul_scalar(-step_size)?, &denom)?;
        }
        Ok(())
    }
}

/// `torch.nn.utils.clip_grad_norm_(params, max_norm)`, first half: the 2-norm of every
/// gradient's 2-norm, and `max_norm / (total + 1e-6)` (Python's `float / tensor` is
/// `reciprocal() * float`) clamped to 1. Returns (total, coefficient) as 0-dim tensors.
pub fn clip_coefficient(grads: &[Tensor], max_norm: f64) -> Result<(Tensor, Tensor)> {
    let norms = grads.iter().filter(|g| g.defined()).map(vector_norm).collect::<std::result::Result<Vec<_>, _>>()?;
    if norms.is_empty() {
        return Ok((Tensor::from(0.0), Tensor::from(1.0)));
    }
    let total = vector_norm(&Tensor::f_stack(&norms, 0)?)?;
    let coef = total.f_add_scalar(1e-6)?.f_reciprocal()?.f_mul_scalar(max_norm)?.f_clamp_max(1.0)?;
    Ok((total, coef))
}

/// Second half: every gradient multiplied by the coefficient in place.
pub fn clip_apply(grads: &[Tensor], coef: &Tensor) -> Result<()> {
    for g in grads.iter().filter(|g| g.defined()) {
        let _ = g.shallow_clone().f_mul_(coef)?;
    }
    Ok(())
}

/// Both halves: what a loop that clips after every micro-batch calls. Returns the coefficient.
pub fn clip_grad_norm(grads: &[Tensor], max_norm: f64) -> Result<f64> {
    let (_, coef) = clip_coefficient(grads, max_norm)?;
    clip_apply(grads, &coef)?;
    Ok(coef.double_value(&[]))
}

/// `torch.linalg.vector_norm(t, 2)`: tch has only `linalg_norm`, which for a 1-D input is
/// exactly that (and for 2-D a matrix norm, hence the flatten).
fn vector_norm(t: &Tensor) -> std::result::Result<Tensor, tch::TchError> {
    t.f_flatten(0, -1)?.f_linalg_norm(2.0, None::<&[i64]>, false, None::<Kind>)
}
