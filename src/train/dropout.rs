//! tiny-lm's dropout masks, one row per sample and site, drawn from the key
//! `plan::dropout::key` gives: `torch.rand((T, D))` right after `manual_seed(key)`, kept
//! where `u >= p`, divided by `1 - p` in float32, then cast to the run's dtype.

use tch::{Device, Kind, Tensor};

use super::models::tiny_lm::{D_MODEL, LAYERS};
use crate::error::Result;
use crate::plan::{dropout, rng};
use crate::spec::{TchKind, TrainConfig};

/// Each block's attention and MLP outputs.
pub const SITES: usize = 2 * LAYERS as usize;

pub struct Dropout {
    p: f64,
    seed: u64,
    seq_len: i64,
    kind: Kind,
    device: Device,
}

impl Dropout {
    /// None without dropout.
    pub fn new(cfg: &TrainConfig, device: Device) -> Option<Self> {
        (cfg.model.lm.dropout > 0.0).then(|| Dropout {
            p: cfg.model.lm.dropout,
            seed: cfg.shape.seed,
            seq_len: cfg.model.lm.seq_len as i64,
            kind: cfg.precision.dtype.kind(),
            device,
        })
    }

    /// Masks `[SITES, B, T, D]` for samples keyed `keys` (their data-set indices, unless a
    /// bug keys them otherwise) drawn in `epoch`; with the keys' digest (`plan::dropout`).
    pub fn masks(&self, epoch: u64, keys: &[i64]) -> Result<(Tensor, f64)> {
        let mut sites = Vec::with_capacity(SITES);
        let mut all = Vec::with_capacity(SITES * keys.len());
        for site in 0..SITES {
            let mut rows = Vec::with_capacity(keys.len());
            for &i in keys {
                let k = dropout::key(self.seed, epoch, i, site);
                all.push(k);
                let u = rng::seeded(k, || Tensor::f_rand([self.seq_len, D_MODEL], (Kind::Float, Device::Cpu)))?;
                rows.push(u.f_ge(self.p)?.f_to_kind(Kind::Float)?.f_div_scalar(1.0 - self.p)?);
            }
            sites.push(Tensor::f_stack(&rows, 0)?);
        }
        let masks = Tensor::f_stack(&sites, 0)?.f_to_kind(self.kind)?.f_to_device(self.device)?;
        Ok((masks, dropout::digest(all)))
    }
}
