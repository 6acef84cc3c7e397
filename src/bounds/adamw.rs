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

use crate::evidence::{Params, Values};

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

/// One compared run's bounds, per parameter and element, in float64.
pub struct AdamWTrack {
    em: Vec<Option<Vec<f64>>>,
    ev: Vec<Option<Vec<f64>>>,
    ew: Vec<Option<Vec<f64>>>,
    /// This step's gradient allowance and |gradient|, until the optimizer has stepped.
    pending: Vec<Option<(Vec<f64>, Vec<f64>)>>,
}

impl AdamWTrack {
    pub fn new(params: usize) -> Self {
        let none = || (0..params).map(|_| None).collect::<Vec<Option<Vec<f64>>>>();
        AdamWTrack { em: none(), ev: none(), ew: none(), pending: (0..params).map(|_| None).collect() }
    }

    /// The step's allowance `a` and accumulation's |gradient| for parameter `i`.
    pub fn before_step(&mut self, i: usize, a: Vec<f64>, g_abs: Vec<f64>) {
        self.pending[i] = Some((a, g_abs));
    }

    /// After accumulation's step `t` (from 1) at learning rate `lr`: `m`, `v` its moments
    /// and `w` its |weight| for parameter `i`.
    #[allow(clippy::too_many_arguments)]
    pub fn after_step(&mut self, i: usize, p: &AdamWParams, t: u32, lr: f64, m: &[f64], v: &[f64], w: &[f64]) {
        self.after_step_within(i, p, t, (lr, lr), m, v, w);
    }

    /// `after_step` where the parameter's learning rate is known only to lie in `lrs` (low,
    /// high): its param group is not recorded, the step's groups' rates are. The update is
    /// carried at the highest rate, the decay's shrinking of a difference at the lowest.
    #[allow(clippy::too_many_arguments)]
    pub fn after_step_within(
        &mut self,
        i: usize,
        p: &AdamWParams,
        t: u32,
        lrs: (f64, f64),
        m: &[f64],
        v: &[f64],
        w: &[f64],
    ) {
        let Some((a, g)) = self.pending[i].take() else { return };
        let (lr_lo, lr) = lrs;
        let ((b1, b2), eps, u) = (p.betas, p.eps, p.u);
        let t = t as f64;
        let bc2_sqrt = (1.0 - b2.powf(t)).powf(0.5);
        let step_size = lr / (1.0 - b1.powf(t));
        let (em_prev, ev_prev, ew_prev) = (self.em[i].take(), self.ev[i].take(), self.ew[i].take());
        let n = a.len();
        let (mut em, mut ev, mut ew) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
        for k in 0..n {
            let (a, g, m, v, w) = (a[k], g[k], m[k].abs(), v[k], w[k]);
            em[k] = a * (1.0 - b1) + m * (2.0 * u) + em_prev.as_ref().map_or(0.0, |e| e[k] * b1);
            ev[k] = a * (g * 2.0 + a) * (1.0 - b2) + v * (3.0 * u) + ev_prev.as_ref().map_or(0.0, |e| e[k] * b2);
            let s = v.sqrt() / bc2_sqrt;
            let denom = s + eps;
            // |√(v+δ) − √v| ≤ min(√|δ|, |δ|/√v).
            let ds = ev[k].sqrt().min(ev[k] / v.sqrt()) / bc2_sqrt + s * (4.0 * u);
            let dd = ds + denom * (2.0 * u);
            let lo = (denom - dd).max(eps);
            let update = m / denom * step_size;
            let du = (em[k] / lo + m * dd / (denom * lo)) * step_size + update * (6.0 * u);
            let rounding = w * (4.0 * u);
            ew[k] = match (&ew_prev, p.lockstep) {
                (Some(f), false) => f[k] * (1.0 - lr_lo * p.weight_decay) + du + rounding,
                _ => du + rounding,
            };
        }
        self.em[i] = Some(em);
        self.ev[i] = Some(ev);
        self.ew[i] = Some(ew);
    }

    /// What each final weight and moment may differ by, `headroom` times the bound, plus
    /// `floor`; parameters that never stepped must match to `floor`. `shapes`: the weights'.
    pub fn finals(&self, names: &[String], shapes: &[Vec<usize>], headroom: f64, floor: f64) -> Params {
        let held = |f: &Option<Vec<f64>>, shape: &[usize]| match f {
            Some(f) => Values::f64s_shaped(shape, f.iter().map(|x| x * headroom + floor).collect()),
            None => Values::f64s_shaped(shape, vec![floor; shape.iter().product()]),
        };
        let mut out: Params =
            names.iter().zip(shapes).zip(&self.ew).map(|((n, s), f)| (n.clone(), held(f, s))).collect();
        for (i, (n, s)) in names.iter().zip(shapes).enumerate() {
            if self.em[i].is_some() {
                out.push((format!("exp_avg.{n}"), held(&self.em[i], s)));
                out.push((format!("exp_avg_sq.{n}"), held(&self.ev[i], s)));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// torch.optim.AdamW's arithmetic on one float32 element: decay, moments, update.
    struct Adam {
        w: f32,
        m: f32,
        v: f32,
    }

    impl Adam {
        fn step(&mut self, p: &AdamWParams, t: i32, lr: f64, g: f32) {
            let (b1, b2) = (p.betas.0 as f32, p.betas.1 as f32);
            self.w *= 1.0 - (lr * p.weight_decay) as f32;
            self.m += (g - self.m) * (1.0 - b1);
            self.v = self.v * b2 + (1.0 - b2) * g * g;
            let bc1 = 1.0 - b1.powi(t);
            let bc2_sqrt = (1.0 - b2.powi(t)).sqrt();
            let denom = self.v.sqrt() / bc2_sqrt + p.eps as f32;
            self.w -= lr as f32 / bc1 * (self.m / denom);
        }
    }

    fn params(weight_decay: f64) -> AdamWParams {
        AdamWParams { betas: (0.9, 0.999), eps: 1e-8, weight_decay, u: f64::from(f32::EPSILON) / 2.0, lockstep: false }
    }

    /// Identical gradients and exact arithmetic: nothing may part.
    #[test]
    fn no_allowance_and_no_rounding_bound_nothing() {
        let p = AdamWParams { u: 0.0, ..params(0.0) };
        let mut t = AdamWTrack::new(1);
        let g = 0.5;
        t.before_step(0, vec![0.0], vec![g]);
        t.after_step(0, &p, 1, 0.1, &[g * 0.1], &[g * g * 0.001], &[1.0]);
        let f = t.finals(&["w".into()], &[vec![1]], 1.0, 0.0);
        assert!(f.iter().all(|(_, a)| a.abs_max() == 0.0), "{f:?}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// Soundness: two float32 AdamW runs whose gradients differ by at most each step's
        /// allowance end with weights and moments no farther apart than the bound, also
        /// where the true gradient is zero and both record opposite-signed rounding noise
        /// (an attention key bias), where Adam's division makes noise a full step.
        #[test]
        fn two_runs_within_each_steps_allowance_end_within_the_bound(
            steps in proptest::collection::vec((-1.0f32..1.0, 0.0f32..1e-3, -1.0f32..1.0), 1..8),
            noise in any::<bool>(),
            wd in prop_oneof![Just(0.0), Just(0.1)],
        ) {
            let (p, lr) = (params(wd), 1e-3);
            let mut track = AdamWTrack::new(1);
            let (mut a, mut b) = (Adam { w: 0.5, m: 0.0, v: 0.0 }, Adam { w: 0.5, m: 0.0, v: 0.0 });
            for (t, &(g, allow, where_in)) in steps.iter().enumerate() {
                let (g, allow) = if noise { (g * 1e-12, allow * 1e-12 + 2e-12) } else { (g, allow) };
                let g2 = g + allow * where_in;
                track.before_step(0, vec![f64::from(allow)], vec![f64::from(g.abs())]);
                a.step(&p, t as i32 + 1, lr, g);
                b.step(&p, t as i32 + 1, lr, g2);
                let (m, v, w) = ([f64::from(a.m)], [f64::from(a.v)], [f64::from(a.w.abs())]);
                track.after_step(0, &p, t as u32 + 1, lr, &m, &v, &w);
            }
            let f = track.finals(&["w".into()], &[vec![1]], 1.0, 0.0);
            let bound = |i: usize| f[i].1.get(0);
            for (i, (x, y)) in [(a.w, b.w), (a.m, b.m), (a.v, b.v)].into_iter().enumerate() {
                prop_assert!(f64::from((x - y).abs()) <= bound(i), "{}: {x} vs {y}, bound {}", f[i].0, bound(i));
            }
        }

        /// Soundness where the parameter's group is unknown: it stepped at one of the
        /// groups' rates (0.1x to 1x), the bound carried within them.
        #[test]
        fn a_parameter_of_an_unknown_group_ends_within_the_bound_of_the_groups_rates(
            steps in proptest::collection::vec((-1.0f32..1.0, 0.0f32..1e-3, -1.0f32..1.0), 1..8),
            slow in any::<bool>(),
        ) {
            let (p, lrs) = (params(0.1), (1e-4, 1e-3));
            let lr = if slow { lrs.0 } else { lrs.1 };
            let mut track = AdamWTrack::new(1);
            let (mut a, mut b) = (Adam { w: 0.5, m: 0.0, v: 0.0 }, Adam { w: 0.5, m: 0.0, v: 0.0 });
            for (t, &(g, allow, where_in)) in steps.iter().enumerate() {
                track.before_step(0, vec![f64::from(allow)], vec![f64::from(g.abs())]);
                a.step(&p, t as i32 + 1, lr, g);
                b.step(&p, t as i32 + 1, lr, g + allow * where_in);
                let (m, v, w) = ([f64::from(a.m)], [f64::from(a.v)], [f64::from(a.w.abs())]);
                track.after_step_within(0, &p, t as u32 + 1, lrs, &m, &v, &w);
            }
            let f = track.finals(&["w".into()], &[vec![1]], 1.0, 0.0);
            prop_assert!(f64::from((a.w - b.w).abs()) <= f[0].1.get(0), "{} vs {}, bound {}", a.w, b.w, f[0].1.get(0));
        }
    }
}
