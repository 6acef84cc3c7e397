//! The big batch's bound: what one batch of all a step's samples may differ by.

use tch::Tensor;

use super::*;

impl Bounds {
    /// The big batch adds the same terms as this window's micro-batches, all in one
    /// reduction per element (over the step's samples, or token positions), where
    /// accumulation adds them micro-batch by micro-batch. Each sum lies within γ(n)·Σ|terms|
    /// of the exact one (Higham), n the step's terms; Σ|micro-batch gradient| + |gradient|
    /// stands for Σ|terms|, and HEADROOM for the forward passes, which round alike but for
    /// the blocking of their matrix products. Elements where micro-batch terms cancel are
    /// also allowed a few ulps of their tensor's largest gradient.
    pub(super) fn big_allowed(&mut self, names: &[String], grads: &[Tensor]) -> Params {
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

    /// Likewise in the big batch, under AdamW (empty otherwise: SGD's finals keep the
    /// fixed tolerance there).
    pub fn finals_big(&self, names: &[String], weights: &[Tensor]) -> Params {
        let weights: Vec<Tensor> = weights.iter().map(work).collect();
        match &self.adamw {
            Some((_, tracks)) if tracks.len() > 1 => tracks[1].finals(names, &weights, HEADROOM, self.tiny),
            _ => Params::new(),
        }
    }
}
