//! tiny-lm's draw from the seed, written once: the token ids, then each sequence's length
//! (`torch.randint(0, V, (N, T))`, then `torch.randint(min_len, T + 1, (N,))`). The data
//! layer builds inputs and labels from it; a planted bug's effect is judged from its
//! lengths (a count-normalisation bug changes nothing where the counts it confuses agree).

use tch::{Device, Kind, Tensor};

use crate::spec::TrainConfig;

/// Token ids `[N, T]` and each sequence's length before padding.
pub fn draw(cfg: &TrainConfig) -> Result<(Tensor, Vec<i64>), tch::TchError> {
    let (n, t) = (cfg.shape.data_size as i64, cfg.model.lm.seq_len as i64);
    let ints = (Kind::Int64, Device::Cpu);
    let (tokens, lengths) = super::rng::seeded(cfg.shape.seed, || -> Result<_, tch::TchError> {
        let tokens = Tensor::f_randint(cfg.model.lm.vocab as i64, [n, t], ints)?;
        let lengths = Tensor::f_randint_low(cfg.model.lm.min_len as i64, t + 1, [n], ints)?;
        Ok((tokens, lengths))
    })?;
    Ok((tokens, Vec::<i64>::try_from(&lengths)?))
}

/// Each sequence's target tokens (its length less one), or none if the draw fails.
pub fn targets(cfg: &TrainConfig) -> Vec<i64> {
    draw(cfg).map(|(_, l)| l.iter().map(|l| l - 1).collect()).unwrap_or_default()
}
