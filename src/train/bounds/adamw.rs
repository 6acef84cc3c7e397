//! What AdamW makes of a gradient allowance, for one run compared with accumulation (DDP,
//! or the big batch): bounds on the difference of the moments and of the weights, carried
//! from step to step as the moments carry the gradients.
//!
//! m = β1·m + (1−β1)·g and v = β2·v + (1−β2)·g² carry the gradient's allowance `a`
//! (|g′² − g²| ≤ a·(2|g| + a)) plus their own rounding; the update step_size·m/(√v/√bc2 + ε)
//! then moves by at most step_size·(Δm/d_lo + |m|·Δd/(d·d_lo)), d_lo the smallest
//! denominator the other run can have (never below ε), and the weight by that plus its
//! decay's rounding. Adam divides by √v, so where a gradient is pure rounding noise (a
//! parameter the loss does not depend on) the update is as large as anywhere: the bound
//! follows, since Δm/d_lo is then of the order of the step itself.

use tch::Tensor;

use crate::evidence::Params;

/// AdamW's settings the bounds need.
#[derive(Clone, Copy, Debug)]
pub struct AdamWParams {
    pub betas: (f64, f64),
    pub eps: f64,
    pub weight_decay: f64,
    /// The unit roundoff of the run's dtype.
    pub u: f64,
    /// Weight differences do not carry from step to step (lockstep restarts).
    pub lockstep: bool,
}

/// One compared run's bounds, per parameter.
pub struct AdamWTrack {
    em: Vec<Option<Tensor>>,
    ev: Vec<Option<Tensor>>,
    ew: Vec<Option<Tensor>>,
    /// This step's gradient allowance and |gradient|, until the optimizer has stepped.
    pending: Vec<Option<(Tensor, Tensor)>>,
}

impl AdamWTrack {
    pub fn new(params: usize) -> Self {
        let none = || (0..params).map(|_| None).collect::<Vec<Option<Tensor>>>();
        AdamWTrack { em: none(), ev: none(), ew: none(), pending: (0..params).map(|_| None).collect() }
    }

    /// The step's allowance `a` and accumulation's |gradient| for parameter `i`.
    pub fn before_step(&mut self, i: usize, a: &Tensor, g_abs: &Tensor) {
        self.pending[i] = Some((a.shallow_clone(), g_abs.shallow_clone()));
    }

    /// After accumulation's step `t` (from 1) at learning rate `lr`: `m`, `v` its moments
    /// and `w` its |weight| for parameter `i`.
    #[allow(clippy::too_many_arguments)]
    pub fn after_step(&mut self, i: usize, p: &AdamWParams, t: u32, lr: f64, m: &Tensor, v: &Tensor, w: &Tensor) {
        let Some((a, g)) = self.pending[i].take() else { return };
        let ((b1, b2), eps, u) = (p.betas, p.eps, p.u);
        let mut em = &a * (1.0 - b1) + m.abs() * (2.0 * u);
        if let Some(prev) = self.em[i].take() {
            em += prev * b1;
        }
        let mut ev = &a * (&g * 2.0 + &a) * (1.0 - b2) + v * (3.0 * u);
        if let Some(prev) = self.ev[i].take() {
            ev += prev * b2;
        }
        let t = t as f64;
        let bc2_sqrt = (1.0 - b2.powf(t)).powf(0.5);
        let step_size = lr / (1.0 - b1.powf(t));
        let s = v.sqrt() / bc2_sqrt;
        let denom = &s + eps;
        // |√(v+δ) − √v| ≤ min(√|δ|, |δ|/√v).
        let ds = ev.sqrt().minimum(&(&ev / v.sqrt())) / bc2_sqrt + &s * (4.0 * u);
        let dd = ds + &denom * (2.0 * u);
        let lo = (&denom - &dd).clamp_min(eps);
        let update = m.abs() / &denom * step_size;
        let du = (&em / &lo + m.abs() * &dd / (&denom * &lo)) * step_size + update * (6.0 * u);
        let rounding = w * (4.0 * u);
        self.ew[i] = Some(match (self.ew[i].take(), p.lockstep) {
            (Some(f), false) => f * (1.0 - lr * p.weight_decay) + du + rounding,
            _ => du + rounding,
        });
        self.em[i] = Some(em);
        self.ev[i] = Some(ev);
    }

    /// What each final weight and moment may differ by, `headroom` times the bound, plus
    /// `floor`; parameters that never stepped must match to `floor`.
    pub fn finals(&self, names: &[String], weights: &[Tensor], headroom: f64, floor: f64) -> Params {
        let held = |f: &Option<Tensor>, w: &Tensor| match f {
            Some(f) => f * headroom + floor,
            None => w.zeros_like() + floor,
        };
        let mut out: Params =
            names.iter().zip(weights).zip(&self.ew).map(|((n, w), f)| (n.clone(), held(f, w))).collect();
        for (i, (n, w)) in names.iter().zip(weights).enumerate() {
            if self.em[i].is_some() {
                out.push((format!("exp_avg.{n}"), held(&self.em[i], w)));
                out.push((format!("exp_avg_sq.{n}"), held(&self.ev[i], w)));
            }
        }
        out
    }
}
