//! Training data exactly as PyTorch makes it, under `torch.manual_seed(seed)`:
//! `torch.rand(N, D)` for the linear model; `torch.rand(N, 3, S, S)` then
//! `torch.randint(0, C, (N,))` for the ResNets; for tiny-lm `torch.randint(0, V, (N, T))`
//! token ids then `torch.randint(min_len, T + 1, (N,))` lengths, each sequence padded with
//! id 0 past its length and labelled with the next token, -100 where there is none
//! (padding and the last position). tch drives the same libtorch CPU generator,
//! so the numbers are bit-identical; float64 runs cast the same float32 draws (`x.double()`).

use tch::{Device, Kind, Tensor};

use crate::error::Result;
use crate::plan::rng::seeded;
use crate::spec::{Dtype, TchKind, TrainConfig};

pub fn linear_data(seed: u64, data_size: usize, features: usize) -> Result<Tensor> {
    Ok(seeded(seed, || Tensor::f_rand([data_size as i64, features as i64], (Kind::Float, Device::Cpu)))?)
}

/// Inputs, and class labels (or next-token labels) for the models that take them.
pub struct Data {
    pub x: Tensor,
    pub y: Option<Tensor>,
    /// tiny-lm: each sequence's length L before padding (its targets are L - 1).
    pub lengths: Option<Vec<i64>>,
}

/// One micro-batch's rows.
pub struct Batch {
    pub x: Tensor,
    pub y: Option<Tensor>,
    /// tiny-lm's dropout masks `[sites, B, T, D]`, when it drops out (`train::dropout`).
    pub dropout: Option<Tensor>,
}

impl Data {
    /// The data set `cfg` describes, in its dtype, on `device` (drawn on the CPU first, as
    /// PyTorch's scripts draw it).
    pub fn new(cfg: &TrainConfig, device: Device) -> Result<Data> {
        let (n, opts) = (cfg.shape.data_size as i64, (Kind::Float, Device::Cpu));
        let on = |t: Tensor| if device == Device::Cpu { t } else { t.to_device(device) };
        if cfg.model.kind.token_loss() {
            let (x, y, lengths) = token_data(cfg)?;
            return Ok(Data { x: on(x), y: Some(on(y)), lengths: Some(lengths) });
        }
        let (x, y) = if cfg.model.kind.is_resnet() {
            let s = cfg.model.resnet.image_size as i64;
            let (x, y) = seeded(cfg.shape.seed, || -> Result<_> {
                let x = Tensor::f_rand([n, 3, s, s], opts)?;
                let y = Tensor::f_randint(cfg.model.resnet.classes as i64, [n], (Kind::Int64, Device::Cpu))?;
                Ok((x, y))
            })?;
            (x, Some(y))
        } else {
            (linear_data(cfg.shape.seed, cfg.shape.data_size, cfg.model.linear.features)?, None)
        };
        let x = if cfg.precision.dtype == Dtype::Float32 { x } else { x.to_kind(cfg.precision.dtype.kind()) };
        Ok(Data { x: on(x), y: y.map(on), lengths: None })
    }

    /// Tokens in these sequences the loss is taken over: targets (after the causal shift),
    /// or with `before_shift` every input token (the bug that counts them).
    pub fn tokens(&self, indices: &[i64], before_shift: bool) -> f64 {
        let Some(lengths) = &self.lengths else { return 0.0 };
        let per = |i: &i64| lengths[*i as usize] - i64::from(!before_shift);
        indices.iter().map(per).sum::<i64>() as f64
    }

    /// The rows of one micro-batch, as `DataLoader`'s default collate stacks them.
    pub fn batch(&self, indices: &[i64]) -> Batch {
        let idx = Tensor::from_slice(indices).to_device(self.x.device());
        Batch { x: self.x.index_select(0, &idx), y: self.y.as_ref().map(|y| y.index_select(0, &idx)), dropout: None }
    }
}

/// tiny-lm's ids `[N, T]`, labels `[N, T]` and lengths, as the module doc says.
fn token_data(cfg: &TrainConfig) -> Result<(Tensor, Tensor, Vec<i64>)> {
    let t = cfg.model.lm.seq_len as i64;
    let ints = (Kind::Int64, Device::Cpu);
    let (tokens, lengths) = crate::plan::tokens::draw(cfg)?;
    let positions = Tensor::arange(t, ints).unsqueeze(0);
    let len = Tensor::from_slice(&lengths).unsqueeze(1);
    // Position j is an input while j < L, and has a target while j + 1 < L.
    let x = tokens.where_self(&positions.lt_tensor(&len), &Tensor::zeros([], ints));
    let next = tokens.roll([-1], [1]);
    let y = next.where_self(&(&positions + 1).lt_tensor(&len), &Tensor::full([], -100, ints));
    Ok((x, y, lengths))
}
