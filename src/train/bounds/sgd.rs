//! The bound carried through the optimizer step: SGD (momentum, weight decay, its own
//! rounding) inline, AdamW through `crate::bounds`; skipped steps; the final weights.

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
        let allowed =
            names.iter().zip(weights).map(|(n, w)| (n.clone(), host(&(work(w).zeros_like() + self.tiny)))).collect();
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
                let g_abs = f64s(&g_abs);
                tracks[0].before_step(i, f64s(&a), g_abs.clone());
                if let (Some(t), Some((_, b))) = (tracks.get_mut(1), big.iter().find(|(n, _)| n == &names[i])) {
                    t.before_step(i, f64s(b), g_abs);
                }
                allowed.push((names[i].clone(), host(&a)));
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
            allowed.push((names[i].clone(), host(&a)));
        }
        (allowed, big.iter().map(|(n, t)| (n.clone(), host(t))).collect())
    }

    /// After the optimizer step: the weights it made. Each run rounds lr·buf and the update.
    pub fn after_step(&mut self, weights: &[Tensor], moments: &[Option<(Tensor, Tensor)>]) {
        if let Some((p, tracks)) = self.adamw.as_mut() {
            self.steps += 1;
            for (i, w) in weights.iter().enumerate() {
                let Some(Some((m, v))) = moments.get(i) else { continue };
                let (m, v, w) = (f64s(m), f64s(v), f64s(&w.abs()));
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
            let shapes: Vec<Vec<usize>> =
                weights.iter().map(|w| w.size().iter().map(|&d| d as usize).collect()).collect();
            return tracks[0].finals(names, &shapes, HEADROOM, self.tiny);
        }
        let parts = names.iter().zip(&weights).zip(&self.weight_err);
        parts
            .map(|((n, w), f)| {
                let f = match f {
                    Some(f) => f * HEADROOM,
                    None => w.zeros_like(),
                };
                (n.clone(), host(&(f + self.tiny)))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const U: f64 = 1.0 / (1u64 << 24) as f64;

    fn sgd(momentum: f64, weight_decay: f64, lr: f64) -> Bounds {
        let optim = crate::spec::OptimConfig { momentum, weight_decay, lr, ..Default::default() };
        let cfg = TrainConfig { optim, ..TrainConfig::article() };
        Bounds::new(&cfg, 1)
    }

    fn values(t: &crate::evidence::Values) -> Vec<f64> {
        t.to_f64()
    }

    /// One step with nothing measured (the floor alone): by hand, b = |g| + wd·|w|,
    /// e = floor + 6u·b, the weight's bound f = lr·e + 2u·(|w| + lr·b), and the final
    /// allowance HEADROOM·f + floor.
    #[test]
    fn one_step_carries_the_floor_and_sgds_own_rounding() {
        let (lr, wd) = (0.5, 0.25);
        let mut b = sgd(0.0, wd, lr);
        let floor = f64::from(f32::from_bits(1)) * 4.0;
        let names = vec!["w".to_string()];
        let (g, w) = (Tensor::from_slice(&[1.0f32, -4.0]), Tensor::from_slice(&[2.0f32, 8.0]));
        b.step(&names, &[g], &[w.shallow_clone()], lr, None);
        b.after_step(&[w.shallow_clone()], &[]);
        let got = values(&b.finals(&names, &[w])[0].1);
        for (got, (g, w)) in got.iter().zip([(1.0, 2.0), (4.0, 8.0)]) {
            let bm = g + wd * w;
            let e = floor + 6.0 * U * bm;
            let f = lr * e + 2.0 * U * (w + lr * bm);
            let want = HEADROOM * f + floor;
            assert!((got - want).abs() <= 8.0 * U * want, "{got} vs {want}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Soundness: two float32 SGD runs whose gradients differ by at most each step's
        /// allowance end with weights no farther apart than the final allowance. The
        /// allowance is planted through the control (|control − g|, no reordered sums).
        #[test]
        fn two_runs_within_each_steps_allowance_end_within_the_final_one(
            steps in proptest::collection::vec(
                proptest::collection::vec((-4.0f32..4.0, 0.0f32..1e-3, -1.0f32..1.0), 3), 1..6),
            w0 in proptest::collection::vec(-2.0f32..2.0, 3),
            momentum in prop_oneof![Just(0.0), Just(0.9)],
            wd in prop_oneof![Just(0.0), Just(0.01)],
        ) {
            let lr = 0.1;
            let mut b = sgd(momentum, wd, lr);
            let names = vec!["w".to_string()];
            let (mut wa, mut wb) = (w0.clone(), w0.clone());
            let (mut ba, mut bb): (Option<Vec<f32>>, Option<Vec<f32>>) = (None, None);
            for step in &steps {
                let g: Vec<f32> = step.iter().map(|s| s.0).collect();
                let c: Vec<f32> = step.iter().map(|s| s.0 + s.1).collect();
                // DDP's gradient: anywhere within HEADROOM·|c − g| of accumulation's.
                let g2: Vec<f32> = step.iter().map(|s| s.0 + s.1 * s.2 * HEADROOM as f32).collect();
                b.control[0] = Some(Tensor::from_slice(&c));
                b.partial_mag[0] = Some(Tensor::zeros([3], (tch::Kind::Float, tch::Device::Cpu)));
                b.step(&names, &[Tensor::from_slice(&g)], &[Tensor::from_slice(&wa)], lr, None);
                for (w, buf, g) in [(&mut wa, &mut ba, &g), (&mut wb, &mut bb, &g2)] {
                    let d: Vec<f32> = g.iter().zip(w.iter()).map(|(g, w)| g + wd as f32 * w).collect();
                    let next: Vec<f32> = match buf.take() {
                        Some(b) => b.iter().zip(&d).map(|(b, d)| momentum as f32 * b + d).collect(),
                        None => d,
                    };
                    for (w, b) in w.iter_mut().zip(&next) {
                        *w -= lr as f32 * b;
                    }
                    *buf = Some(next);
                }
                b.after_step(&[Tensor::from_slice(&wa)], &[]);
            }
            let allowed = values(&b.finals(&names, &[Tensor::from_slice(&wa)])[0].1);
            for ((a, b), allowed) in wa.iter().zip(&wb).zip(allowed) {
                prop_assert!(f64::from((a - b).abs()) <= allowed, "{a} vs {b}: allowed {allowed}");
            }
        }
    }
}
