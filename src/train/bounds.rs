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

use super::adamw_bounds::{AdamWParams, AdamWTrack};
use crate::error::Result;
use crate::evidence::Params;
use crate::spec::DeviceKind;
use crate::spec::{Dtype, Optimizer, TrainConfig};

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

impl Bounds {
    pub fn new(cfg: &TrainConfig, params: usize) -> Self {
        let w = cfg.gpus;
        let narrow = cfg.dtype.is_narrow();
        // NCCL may round at every hop in the dtype itself; the host path (CPU ranks, or ranks
        // sharing GPUs) adds in float32 (float64 for float64) and rounds once.
        let host = cfg.device == DeviceKind::Cpu || cfg.shared_gpus.is_some();
        let reduce_u = match (host, narrow) {
            (true, true) => Dtype::Float32.unit_roundoff(),
            _ => cfg.dtype.unit_roundoff(),
        };
        // bfloat16's gradients are summed in float32, whose subnormals are the finer.
        let tiny = match cfg.dtype {
            Dtype::Bfloat16 => Dtype::Float32,
            d => d,
        }
        .smallest_subnormal();
        let none = || (0..params).map(|_| None).collect::<Vec<Option<Tensor>>>();
        Bounds {
            world: w,
            // float16's small gradients are subnormal, where scaling by W is not exact; so
            // are float16 autocast's, and its large ones may overflow at W times the scale.
            exact_scaling: w.is_power_of_two() && cfg.dtype != Dtype::Float16 && !cfg.amp.scaled(),
            reduce_u,
            dtype: cfg.dtype,
            tiny: tiny * (cfg.acc_steps + w) as f64,
            subnormal: tiny,
            u: cfg.dtype.unit_roundoff(),
            lr: cfg.lr,
            momentum: cfg.momentum,
            weight_decay: cfg.weight_decay,
            lockstep: cfg.lockstep,
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
                    weight_decay: cfg.weight_decay,
                    u: cfg.dtype.unit_roundoff(),
                    lockstep: cfg.lockstep,
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

    /// One micro-batch's backward, for the accumulation run: `.grad` grows by exactly what
    /// autograd would add (the first of a window by a plain backward, later ones by taking
    /// the micro-batch gradient and adding it, which is what autograd does), and the control
    /// takes its share. `divisor`: what accumulation divides this loss by; DDP divides it by
    /// divisor / W (K/W for K, T/W for T tokens; unless a bug is planted in accumulation).
    /// `rows`: the terms the micro-batch's reductions add up.
    /// `scale`: the loss scale under `--amp float16`, which both runs multiply each loss by.
    pub fn backward(
        &mut self,
        loss: &Tensor,
        divisor: f64,
        rows: usize,
        params: &[Tensor],
        scale: Option<&Tensor>,
    ) -> Result<()> {
        let rank = self.position % self.world;
        self.position += 1;
        self.rows += rows;
        let control = match self.exact_scaling {
            // DDP's seed, through the same graph, kept for accumulation's backward below.
            false => {
                let ddp_seed = super::scaler::seed(loss, divisor / self.world as f64, scale);
                let grads = Tensor::f_run_backward(&[ddp_seed], params, true, false)?;
                if scale.is_some() {
                    self.ddp_found_inf |= grads.iter().any(|g| g.defined() && g.isfinite().all().int64_value(&[]) == 0);
                }
                Some(grads)
            }
            true => None,
        };
        let scaled = super::scaler::seed(loss, divisor, scale);
        let fresh = params.iter().all(|p| !p.grad().defined());
        let grads: Vec<Tensor> = if fresh {
            scaled.f_backward()?;
            // Copied only where they are DDP's terms (times W): `.grad` grows on.
            match control {
                None => params.iter().map(|p| p.grad().copy()).collect(),
                Some(_) => Vec::new(),
            }
        } else {
            let grads = Tensor::f_run_backward(&[&scaled], params, false, false)?;
            for (p, g) in params.iter().zip(&grads) {
                if !g.defined() {
                    continue;
                }
                if !p.grad().defined() {
                    // A parameter reached for the first time this window: a zero .grad,
                    // which adding to leaves the gradient itself.
                    (p.sum(None) * 0.0).f_backward()?;
                }
                tch::no_grad(|| p.grad().f_add_(g).map(|_| ()))?;
            }
            grads
        };
        if self.big {
            let mags: Vec<Tensor> = match fresh {
                true => params.iter().map(|p| p.grad()).collect(),
                false => grads.iter().map(Tensor::shallow_clone).collect(),
            };
            for (m, g) in self.micro_mag.iter_mut().zip(mags) {
                match m {
                    _ if !g.defined() => {}
                    Some(m) => *m += work(&g).abs(),
                    None => *m = Some(work(&g).abs()),
                }
            }
        }
        // DDP's micro-batch gradient: the control's, or W times accumulation's (exact), kept
        // unscaled here and so already the partial over W.
        let terms = control.unwrap_or(grads);
        for (partial, g) in self.partials[rank].iter_mut().zip(terms) {
            match partial {
                _ if !g.defined() => {}
                // In place, as `.grad` accumulates on a rank.
                Some(p) => *p += g,
                None => *partial = Some(g),
            }
        }
        Ok(())
    }

    /// The accumulation run multiplied its gradient so far by `coef` (clipping a partial
    /// sum): DDP's partial sums of the same micro-batches follow, so the control keeps
    /// replaying this run's mathematics.
    pub fn rescale(&mut self, coef: f64) {
        for p in self.partials.iter_mut().flatten().chain(self.micro_mag.iter_mut()).flatten() {
            *p *= coef;
        }
    }

    /// Whether DDP's loss scaler will find inf/NaN in this window (its micro-batch gradients,
    /// replayed by the control: any non-finite one makes the all-reduced sum non-finite).
    pub fn take_ddp_found_inf(&mut self) -> bool {
        std::mem::take(&mut self.ddp_found_inf)
    }

    /// A step the loss scaler skipped in both runs (inf/NaN found): nothing is applied and no
    /// difference carries on; the window's partial sums are dropped. Its gradients are not
    /// compared, so the allowance returned only keeps the per-step list in step.
    pub fn skip(&mut self, names: &[String], weights: &[Tensor]) -> (Params, Params) {
        self.position = 0;
        self.rows = 0;
        for slot in self.partials.iter_mut().flatten().chain(&mut self.control).chain(&mut self.partial_mag) {
            *slot = None;
        }
        for slot in self.micro_mag.iter_mut() {
            *slot = None;
        }
        let allowed = names.iter().zip(weights).map(|(n, w)| (n.clone(), work(w).zeros_like() + self.tiny)).collect();
        (allowed, Params::new())
    }

    /// At an optimizer step, before it: `grads` are the accumulated gradients it will apply,
    /// `weights` the weights it starts from. Returns what each gradient element may differ
    /// by in DDP, and in the big batch (empty when there is none).
    pub fn step(
        &mut self,
        names: &[String],
        grads: &[Tensor],
        weights: &[Tensor],
        lr: f64,
        clip: Option<Clip>,
    ) -> (Params, Params) {
        self.fold_partials();
        self.position = 0;
        self.lr = lr;
        let mut big = self.big_allowed(names, grads);
        let gs: Vec<Tensor> =
            grads.iter().zip(weights).map(|(g, w)| if g.defined() { work(g) } else { work(w).zeros_like() }).collect();
        let mut pre: Vec<Tensor> = gs
            .iter()
            .enumerate()
            .map(|(i, g)| match (self.control[i].take(), self.partial_mag[i].take()) {
                (Some(c), Some(mag)) => self.allowed(c, mag, g),
                _ => g.zeros_like() + self.tiny,
            })
            .collect();
        let mut gs = gs;
        if let Some(c) = clip {
            if !big.is_empty() {
                let big_grads: Vec<Tensor> = big
                    .iter()
                    .map(|(n, _)| {
                        names.iter().position(|m| m == n).map_or_else(|| gs[0].zeros_like(), |i| gs[i].shallow_clone())
                    })
                    .collect();
                let mut a: Vec<Tensor> = big.iter().map(|(_, t)| t.shallow_clone()).collect();
                self.clipped(&mut a, &big_grads, c);
                big = big.into_iter().zip(a).map(|((n, _), t)| (n, t)).collect();
            }
            self.clipped(&mut pre, &gs, c);
            gs = gs.iter().map(|g| g * c.coef).collect();
        }
        let mut allowed = Params::new();
        for (i, ((g, w), a)) in gs.into_iter().zip(weights).zip(pre).enumerate() {
            let w = work(w).abs();
            if let Some((_, tracks)) = self.adamw.as_mut() {
                let g_abs = g.abs();
                tracks[0].before_step(i, &a, &g_abs);
                if let (Some(t), Some((_, b))) = (tracks.get_mut(1), big.iter().find(|(n, _)| n == &names[i])) {
                    t.before_step(i, b, &g_abs);
                }
                allowed.push((names[i].clone(), a));
                continue;
            }
            // SGD: d = g + wd·w; buf = μ·buf + d; w -= lr·buf. Each run rounds d and buf
            // itself (three operations of at most |buf| each, on both sides). In place: a
            // resnet18 step is 11M elements per buffer.
            let mut d_mag = g.abs();
            if self.weight_decay != 0.0 {
                d_mag += &w * self.weight_decay;
            }
            let b = match self.buf_mag[i].take() {
                Some(mut b) => {
                    b *= self.momentum;
                    b += d_mag;
                    b
                }
                None => d_mag,
            };
            let mut e = match self.buf_err[i].take() {
                Some(mut e) => {
                    e *= self.momentum;
                    e += &a;
                    e
                }
                None => a.copy(),
            };
            if let (Some(f), false, true) = (&self.weight_err[i], self.lockstep, self.weight_decay != 0.0) {
                e += f * self.weight_decay;
            }
            e += &b * (6.0 * self.u);
            self.buf_mag[i] = Some(b);
            self.buf_err[i] = Some(e);
            allowed.push((names[i].clone(), a));
        }
        (allowed, big)
    }

    /// Clipping multiplies every gradient by one coefficient, which each run computes from
    /// its own total norm: the totals differ by at most the allowance's 2-norm (the norm is
    /// 1-Lipschitz) plus each run's rounding of it (a cascaded sum of squares of n terms,
    /// within γ(⌈log₂ n⌉ + 32) of the exact one in the accumulating precision, then one
    /// rounding to the dtype), so the coefficients by at most what
    /// min(1, max / (x + 1e-6)) moves over that interval, plus their own rounding. Each
    /// element's allowance becomes coef·a + HEADROOM·(|g|·Δcoef + the product's rounding).
    fn clipped(&self, allowed: &mut [Tensor], grads: &[Tensor], c: Clip) {
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

    /// The big batch adds the same terms as this window's micro-batches, all in one
    /// reduction per element (over the step's samples, or token positions), where
    /// accumulation adds them micro-batch by micro-batch. Each sum lies within γ(n)·Σ|terms|
    /// of the exact one (Higham), n the step's terms; Σ|micro-batch gradient| + |gradient|
    /// stands for Σ|terms|, and HEADROOM for the forward passes, which round alike but for
    /// the blocking of their matrix products. Elements where micro-batch terms cancel are
    /// also allowed a few ulps of their tensor's largest gradient.
    fn big_allowed(&mut self, names: &[String], grads: &[Tensor]) -> Params {
        let rows = std::mem::take(&mut self.rows);
        if !self.big {
            return Params::new();
        }
        let reach = HEADROOM * 2.0 * gamma(rows, self.u);
        let mut out = Params::new();
        for (i, g) in grads.iter().enumerate() {
            let Some(mut m) = self.micro_mag[i].take() else { continue };
            if !g.defined() {
                continue;
            }
            let g = work(g).abs();
            let peak = g.max().double_value(&[]);
            m += &g;
            m *= reach;
            m += CANCELLED_ULPS * 2.0 * self.u * peak + self.tiny;
            out.push((names[i].clone(), m));
        }
        out
    }

    /// HEADROOM times the farthest DDP's gradient can be from accumulation's `g`: the
    /// all-reduce adds the same partials as the control's total `c` in another order, so
    /// both lie within γ(W−1)·Σ|partial| (`mag`) of the exact sum, within `reach` of each
    /// other. Where the reduction then rounds back to a narrow dtype (bfloat16, float16 on
    /// the host), rounding is monotone, so DDP's result lies between the two ends of
    /// c ± reach rounded (widened by float32's own rounding of them).
    fn allowed(&self, mut c: Tensor, mut mag: Tensor, g: &Tensor) -> Tensor {
        let narrow = self.dtype.is_narrow();
        let mut reach = {
            mag *= 2.0 * gamma(self.world.saturating_sub(1), self.reduce_u);
            mag
        };
        let mut floor = if narrow {
            reach += c.abs() * Dtype::Float32.epsilon();
            let end = |t: Tensor| (t.to_kind(self.dtype.kind()).to_kind(Kind::Float) - g).abs();
            end(&c - &reach).maximum(&end(&c + &reach))
        } else {
            c -= g;
            let _ = c.abs_();
            c += reach;
            c
        };
        floor *= HEADROOM;
        // Where the control met inf or NaN (float16 overflowing in DDP's replayed arithmetic
        // but not in accumulation's, or a planted divisor bug) nothing is derived: nothing
        // is allowed beyond the floor, never an infinite allowance that passes anything.
        let finite = floor.isfinite();
        let floor = floor.where_self(&finite, &floor.zeros_like());
        floor + self.tiny
    }

    /// After the optimizer step: the weights it made. Each run rounds lr·buf and the update.
    pub fn after_step(&mut self, weights: &[Tensor], moments: &[Option<(Tensor, Tensor)>]) {
        if let Some((p, tracks)) = self.adamw.as_mut() {
            self.steps += 1;
            for (i, w) in weights.iter().enumerate() {
                let Some(Some((m, v))) = moments.get(i) else { continue };
                let (m, v, w) = (work(m), work(v), work(w).abs());
                for t in tracks.iter_mut() {
                    t.after_step(i, p, self.steps, self.lr, &m, &v, &w);
                }
            }
            return;
        }
        for (i, w) in weights.iter().enumerate() {
            let (Some(e), Some(b)) = (&self.buf_err[i], &self.buf_mag[i]) else { continue };
            let rounding = (work(w).abs() + b * self.lr) * (2.0 * self.u);
            let update = e * self.lr + rounding;
            self.weight_err[i] = Some(match (self.weight_err[i].take(), self.lockstep) {
                (Some(mut f), false) => {
                    f += update;
                    f
                }
                _ => update,
            });
        }
    }

    /// What each final weight may differ by in DDP, and under AdamW each moment
    /// (`exp_avg.<param>`, `exp_avg_sq.<param>`).
    pub fn finals(&self, names: &[String], weights: &[Tensor]) -> Params {
        let weights: Vec<Tensor> = weights.iter().map(work).collect();
        if let Some((_, tracks)) = &self.adamw {
            return tracks[0].finals(names, &weights, HEADROOM, self.tiny);
        }
        let parts = names.iter().zip(&weights).zip(&self.weight_err);
        parts
            .map(|((n, w), f)| {
                let f = match f {
                    Some(f) => f * HEADROOM,
                    None => w.zeros_like(),
                };
                (n.clone(), f + self.tiny)
            })
            .collect()
    }

    /// Likewise in the big batch, under AdamW (empty otherwise: SGD's finals keep the
    /// fixed tolerance there).
    pub fn finals_big(&self, names: &[String], weights: &[Tensor]) -> Params {
        let weights: Vec<Tensor> = weights.iter().map(work).collect();
        match &self.adamw {
            Some((_, tracks)) if tracks.len() > 1 => tracks[1].finals(names, &weights, HEADROOM, self.tiny),
            _ => Params::new(),
        }
    }

    /// Each rank's partial, times 1/W as the reducer does it, added to the control's total
    /// in rank order (narrow dtypes in float32, as the host all-reduce adds them).
    fn fold_partials(&mut self) {
        let inv = 1.0 / self.world as f64;
        for r in 0..self.world {
            for (i, partial) in self.partials[r].iter_mut().enumerate() {
                let Some(mut q) = partial.take() else { continue };
                if !self.exact_scaling {
                    // In place, as the reducer does it: for bfloat16 and float16 the in-place
                    // product rounds 1/W to the dtype first, the out-of-place one does not.
                    let _ = q.g_mul_scalar_(inv);
                }
                let q = work(&q);
                match &mut self.partial_mag[i] {
                    Some(m) => *m += q.abs(),
                    none => *none = Some(q.abs()),
                }
                match &mut self.control[i] {
                    Some(c) => *c += q,
                    none => *none = Some(q),
                }
            }
        }
    }
}

/// The accumulation run's clipping of one step: `max_norm`, its gradient's total norm, and
/// the coefficient it multiplied every gradient by.
#[derive(Clone, Copy, Debug)]
pub struct Clip {
    pub max: f64,
    pub total: f64,
    pub coef: f64,
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
