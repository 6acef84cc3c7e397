//! The control: DDP's arithmetic replayed inside the accumulation run, from the same
//! weights and micro-batches, and Higham's reach for the all-reduce's own order.

use crate::train::MicroBatchLoss;
use tch::{Kind, Tensor};

use super::*;

impl Bounds {
    /// One micro-batch's backward, for the accumulation run: `.grad` grows by exactly what
    /// autograd would add (the first of a window by a plain backward, later ones by taking
    /// the micro-batch gradient and adding it, which is what autograd does), and the control
    /// takes its share. `divisor`: what accumulation divides this loss by; DDP divides it by
    /// divisor / W (K/W for K, T/W for T tokens; unless a bug is planted in accumulation).
    pub fn backward(&mut self, mb: &MicroBatchLoss) -> Result<()> {
        let MicroBatchLoss { loss, divisor, rows, params, scale } = *mb;
        let rank = self.position % self.world;
        self.position += 1;
        self.rows += rows;
        let control = match self.exact_scaling {
            // DDP's seed, through the same graph, kept for accumulation's backward below.
            false => {
                let ddp_seed = crate::train::scaler::seed(loss, divisor / self.world as f64, scale);
                let grads = Tensor::f_run_backward(&[ddp_seed], params, true, false)?;
                if scale.is_some() {
                    self.ddp_found_inf |= grads.iter().any(|g| g.defined() && g.isfinite().all().int64_value(&[]) == 0);
                }
                Some(grads)
            }
            true => None,
        };
        let scaled = crate::train::scaler::seed(loss, divisor, scale);
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

    /// Each rank's partial, times 1/W as the reducer does it, added to the control's total
    /// in rank order (narrow dtypes in float32, as the host all-reduce adds them).
    pub(super) fn fold_partials(&mut self) {
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

    /// HEADROOM times the farthest DDP's gradient can be from accumulation's `g`: the
    /// all-reduce adds the same partials as the control's total `c` in another order, so
    /// both lie within γ(W−1)·Σ|partial| (`mag`) of the exact sum, within `reach` of each
    /// other. Where the reduction then rounds back to a narrow dtype (bfloat16, float16 on
    /// the host), rounding is monotone, so DDP's result lies between the two ends of
    /// c ± reach rounded (widened by float32's own rounding of them).
    pub(super) fn allowed(&self, mut c: Tensor, mut mag: Tensor, g: &Tensor) -> Tensor {
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
}
