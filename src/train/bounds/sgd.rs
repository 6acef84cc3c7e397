//! The bound carried through the optimizer step: SGD (momentum, weight decay, its own
//! rounding) inline, AdamW through `adamw.rs`; skipped steps; the final weights.

use tch::Tensor;

use super::*;

impl Bounds {
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
}
