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
    pub(super) fn big_allowed(&mut self, names: &[String], grads: &[Tensor]) -> Vec<(String, Tensor)> {
        let rows = std::mem::take(&mut self.rows);
        if !self.big {
            return Vec::new();
        }
        let reach = HEADROOM * 2.0 * gamma(rows, self.u);
        let mut out = Vec::new();
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
        let shapes: Vec<Vec<usize>> = weights.iter().map(|w| w.size().iter().map(|&d| d as usize).collect()).collect();
        match &self.adamw {
            Some((_, tracks)) if tracks.len() > 1 => tracks[1].finals(names, &shapes, HEADROOM, self.tiny),
            _ => Params::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// Soundness: the same float32 terms summed micro-batch by micro-batch (accumulation)
        /// and all at once in another order (the big batch) differ by no more than the big
        /// batch's allowance, also where whole micro-batches cancel each other. (Terms that
        /// cancel inside one micro-batch are not in Σ|micro-batch gradient|: there the
        /// allowance leans on CANCELLED_ULPS of the tensor's largest gradient instead.)
        #[test]
        fn a_sum_by_micro_batches_and_one_reordered_sum_stay_within_the_allowance(
            terms in proptest::collection::vec(0.0f32..1e3, 2..64),
            k in 1usize..5,
            alternate in any::<bool>(),
        ) {
            let size = terms.len().div_ceil(k);
            // Each micro-batch's terms share a sign; with `alternate`, micro-batches flip it.
            let terms: Vec<f32> = terms
                .iter()
                .enumerate()
                .map(|(i, t)| if alternate && (i / size) % 2 == 1 { -t } else { *t })
                .collect();
            let mut b = Bounds::new(&TrainConfig::article(), 1);
            b.big = true;
            let micro: Vec<f32> = terms.chunks(size).map(|c| c.iter().sum()).collect();
            let acc: f32 = micro.iter().sum();
            let big: f32 = terms.iter().rev().sum();
            b.rows = terms.len();
            b.micro_mag[0] = Some(Tensor::from_slice(&[micro.iter().map(|m| m.abs()).sum::<f32>()]));
            let allowed = b.big_allowed(&["w".into()], &[Tensor::from_slice(&[acc])]);
            let a = allowed[0].1.double_value(&[0]);
            prop_assert!(f64::from((acc - big).abs()) <= a, "{acc} vs {big}: allowed {a}");
        }
    }
}
