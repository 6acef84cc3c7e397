//! tiny-lm: a small causal transformer (token and position embeddings, two pre-LayerNorm
//! blocks of 2-head attention and a GELU MLP, a final LayerNorm and an untied LM head).
//! Its forward is written op for op as `fixtures/lm_reference.py` writes it, so PyTorch's
//! goldens rebuild it exactly; its loss is the *sum* of per-token cross-entropy over the
//! micro-batch's targets, which the run divides by the step's token count (`plan::norm`).
//!
//! Initialisation, under `torch.manual_seed(seed)`: for every parameter in name order,
//! LayerNorm weights 1, biases 0, every other tensor `torch.randn(shape) * 0.02`.

use tch::{Device, Kind, Tensor};

use super::{Autocast, Model};
use crate::train::data::Batch;

/// Width of the residual stream.
pub const D_MODEL: i64 = 32;
pub const HEADS: i64 = 2;
pub const LAYERS: i64 = 2;
/// Width of each block's MLP.
pub const MLP: i64 = 128;
const LN_EPS: f64 = 1e-5;
/// Labels PyTorch's cross-entropy skips (`ignore_index`): padding and each sequence's last position.
pub const IGNORE_INDEX: i64 = -100;

pub struct TinyLm {
    /// Sorted by name.
    params: Vec<(String, Tensor)>,
    cast: Autocast,
}

/// Every parameter's name and shape, in name order.
pub fn layout(vocab: i64, seq_len: i64) -> Vec<(String, Vec<i64>)> {
    let d = D_MODEL;
    let mut p = vec![
        ("tok_emb.weight".to_string(), vec![vocab, d]),
        ("pos_emb.weight".to_string(), vec![seq_len, d]),
        ("ln_f.weight".to_string(), vec![d]),
        ("ln_f.bias".to_string(), vec![d]),
        ("head.weight".to_string(), vec![vocab, d]),
    ];
    for l in 0..LAYERS {
        let b = |s: &str| format!("blocks.{l}.{s}");
        p.extend([
            (b("ln1.weight"), vec![d]),
            (b("ln1.bias"), vec![d]),
            (b("attn.qkv.weight"), vec![3 * d, d]),
            (b("attn.qkv.bias"), vec![3 * d]),
            (b("attn.proj.weight"), vec![d, d]),
            (b("attn.proj.bias"), vec![d]),
            (b("ln2.weight"), vec![d]),
            (b("ln2.bias"), vec![d]),
            (b("mlp.fc.weight"), vec![MLP, d]),
            (b("mlp.fc.bias"), vec![MLP]),
            (b("mlp.proj.weight"), vec![d, MLP]),
            (b("mlp.proj.bias"), vec![d]),
        ]);
    }
    p.sort_by(|a, b| a.0.cmp(&b.0));
    p
}

impl TinyLm {
    /// Drawn from the generator as the module doc says; `blank`: zeros (every value will
    /// be overwritten before use).
    pub fn new(
        vocab: usize,
        seq_len: usize,
        seed: u64,
        blank: bool,
        kind: Kind,
        device: Device,
        cast: Autocast,
    ) -> Self {
        let opts = (Kind::Float, Device::Cpu);
        let draw = || {
            layout(vocab as i64, seq_len as i64)
                .into_iter()
                .map(|(name, shape)| {
                    let t = if name.ends_with(".bias") || blank {
                        Tensor::zeros(&shape, opts)
                    } else if is_layer_norm_weight(&name) {
                        Tensor::ones(&shape, opts)
                    } else {
                        Tensor::randn(&shape, opts) * 0.02
                    };
                    (name, t)
                })
                .collect::<Vec<_>>()
        };
        let params = if blank { draw() } else { crate::plan::rng::seeded(seed, draw) };
        let params = params
            .into_iter()
            .map(|(n, t)| {
                let t =
                    if kind == Kind::Float && device == Device::Cpu { t } else { t.to_device(device).to_kind(kind) };
                (n, t.set_requires_grad(true))
            })
            .collect();
        TinyLm { params, cast }
    }

    fn p(&self, name: &str) -> &Tensor {
        let i = self.params.binary_search_by(|(n, _)| n.as_str().cmp(name)).expect("a tiny-lm parameter");
        &self.params[i].1
    }

    fn layer_norm(&self, x: &Tensor, prefix: &str) -> Tensor {
        let (w, b) = (self.p(&format!("{prefix}.weight")), self.p(&format!("{prefix}.bias")));
        x.layer_norm([D_MODEL], Some(w), Some(b), LN_EPS, false)
    }

    fn linear(&self, x: &Tensor, prefix: &str, bias: bool) -> Tensor {
        let c = self.cast;
        let b = bias.then(|| c.low(self.p(&format!("{prefix}.bias"))));
        c.low(x).linear(&c.low(self.p(&format!("{prefix}.weight"))), b)
    }

    /// Logits `[b, T, V]` for input ids `[b, T]`. Residual adds make new tensors, as
    /// PyTorch's `h = h + ...` does: tch's `+=` is in place and would overwrite the input
    /// LayerNorm saved for its backward.
    #[allow(clippy::assign_op_pattern)]
    /// `masks`: dropout's `[2·LAYERS, b, T, D]`, multiplying each block's attention output
    /// (site 2l) and MLP output (site 2l + 1) before its residual add.
    fn forward(&self, ids: &Tensor, masks: Option<&Tensor>) -> Tensor {
        let drop = |y: Tensor, site: i64| match masks {
            Some(m) => y * m.get(site),
            None => y,
        };
        let (b, t) = (ids.size()[0], ids.size()[1]);
        let hd = D_MODEL / HEADS;
        let positions = Tensor::arange(t, (Kind::Int64, ids.device()));
        let mut h = Tensor::embedding(self.p("tok_emb.weight"), ids, -1, false, false)
            + Tensor::embedding(self.p("pos_emb.weight"), &positions, -1, false, false);
        let causal = Tensor::ones([t, t], (Kind::Bool, ids.device())).triu(1);
        for l in 0..LAYERS {
            let blk = format!("blocks.{l}");
            let a = self.layer_norm(&h, &format!("{blk}.ln1"));
            let qkv = self.linear(&a, &format!("{blk}.attn.qkv"), true);
            let heads = |x: &Tensor| x.view([b, t, HEADS, hd]).transpose(1, 2);
            let parts = qkv.split(D_MODEL, -1);
            let (q, k, v) = (heads(&parts[0]), heads(&parts[1]), heads(&parts[2]));
            let c = self.cast;
            let att = c.low(&q).matmul(&c.low(&k.transpose(-2, -1))) * (1.0 / (hd as f64).sqrt());
            let att = att.masked_fill(&causal, f64::NEG_INFINITY).softmax(-1, None::<Kind>);
            let y = c.low(&att).matmul(&c.low(&v)).transpose(1, 2).contiguous().view([b, t, D_MODEL]);
            h = h + drop(self.linear(&y, &format!("{blk}.attn.proj"), true), 2 * l);
            let m = self.layer_norm(&h, &format!("{blk}.ln2"));
            let f = self.linear(&m, &format!("{blk}.mlp.fc"), true).gelu("none");
            h = h + drop(self.linear(&f, &format!("{blk}.mlp.proj"), true), 2 * l + 1);
        }
        let h = self.layer_norm(&h, "ln_f");
        self.linear(&h, "head", false)
    }
}

fn is_layer_norm_weight(name: &str) -> bool {
    ["ln1.weight", "ln2.weight", "ln_f.weight"].iter().any(|s| name.ends_with(s))
}

impl Model for TinyLm {
    fn registration(&self) -> &'static [&'static str] {
        &[
            "tok_emb", "pos_emb", "blocks", "ln_f", "head", "ln1", "attn", "ln2", "mlp", "qkv", "fc", "proj", "weight",
            "bias",
        ]
    }

    fn parameters(&self) -> &[(String, Tensor)] {
        &self.params
    }

    /// The sum of per-token cross-entropy over the micro-batch's targets
    /// (`F.cross_entropy(..., ignore_index=-100, reduction="sum")`).
    fn loss(&self, batch: &Batch) -> Tensor {
        let labels = batch.y.as_ref().expect("tiny-lm batches carry labels");
        let logits = self.forward(&batch.x, batch.dropout.as_ref());
        let vocab = logits.size()[2];
        self.cast.full(&logits.reshape([-1, vocab])).cross_entropy_loss::<Tensor>(
            &labels.reshape([-1]),
            None,
            tch::Reduction::Sum,
            IGNORE_INDEX,
            0.0,
        )
    }
}
