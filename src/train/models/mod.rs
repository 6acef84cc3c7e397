//! Models trained by both runs. Parameters carry PyTorch's `state_dict` names, because
//! those names are how our traces meet the ones PyTorch writes.

mod linear;
mod resnet;
pub mod tiny_lm;

pub use linear::Linear;
pub use resnet::{ResNet, ResNetSpec};
pub use tiny_lm::TinyLm;

use tch::{Device, Kind, Tensor};

use crate::error::Result;
use crate::spec::{ModelKind, TchKind, TrainConfig};
use crate::train::data::Batch;

pub trait Model {
    /// Trainable parameters, sorted by name.
    fn parameters(&self) -> &[(String, Tensor)];
    /// State that is not trained but changes in forward (BatchNorm's running statistics),
    /// sorted by name.
    fn buffers(&self) -> &[(String, Tensor)] {
        &[]
    }
    /// The micro-batch's loss before any accumulation scaling.
    fn loss(&self, batch: &Batch) -> Tensor;
    /// Module names in the order PyTorch's `__init__` registers them (`model.parameters()`
    /// order), where it is not the names' order: clipping sums the squared norms in it.
    fn registration(&self) -> &'static [&'static str] {
        &[]
    }
}

/// Indices into `model.parameters()` in PyTorch's registration order: names compared
/// component by component, by each component's place in `model.registration()`, numbers
/// (`blocks.1`, `layer1.0`) by value.
pub fn torch_order(model: &dyn Model) -> Vec<usize> {
    let ranks = model.registration();
    let key = |name: &str| -> Vec<(usize, u64)> {
        name.split('.')
            .map(|c| match c.parse::<u64>() {
                Ok(n) => (0, n),
                Err(_) => (1, ranks.iter().position(|r| *r == c).unwrap_or(ranks.len()) as u64),
            })
            .collect()
    };
    let params = model.parameters();
    let mut order: Vec<usize> = (0..params.len()).collect();
    order.sort_by_key(|&i| key(&params[i].0));
    order
}

/// What `torch.autocast("cpu", dtype)` does to the ops our models call (`--amp`): matrix
/// products and convolutions take their floating inputs in the autocast dtype (CPU's
/// lower-precision list), cross-entropy takes float32 (its float32 list), and every other op
/// runs in the dtype that reaches it (LayerNorm, softmax, GELU and BatchNorm in bfloat16 over
/// float32 weights; a residual add promotes to float32). Casting is an op autograd records,
/// so gradients come back to float32 through it, as they do under autocast.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Autocast(pub Option<Kind>);

impl Autocast {
    /// An input of a lower-precision op: cast when floating, not float64, and not already in
    /// the autocast dtype (autocast's `cached_cast` rule).
    pub fn low(self, t: &Tensor) -> Tensor {
        match self.0 {
            Some(k) if eligible(t) && t.kind() != k => t.to_kind(k),
            _ => t.shallow_clone(),
        }
    }

    /// An input of a float32 op.
    pub fn full(self, t: &Tensor) -> Tensor {
        match self.0 {
            Some(_) if eligible(t) && t.kind() != Kind::Float => t.to_kind(Kind::Float),
            _ => t.shallow_clone(),
        }
    }
}

fn eligible(t: &Tensor) -> bool {
    t.is_floating_point() && t.kind() != Kind::Double
}

/// How many values the model learns, without building it.
pub fn parameter_count(cfg: &TrainConfig) -> f64 {
    match cfg.model.kind {
        ModelKind::Linear => cfg.model.linear.features as f64,
        ModelKind::Resnet18 => ResNetSpec::resnet18(cfg.model.resnet.classes as i64).parameter_count(),
        ModelKind::ResnetTiny => ResNetSpec::tiny(cfg.model.resnet.classes as i64).parameter_count(),
        ModelKind::TinyLm => tiny_lm::layout(cfg.model.lm.vocab as i64, cfg.model.lm.seq_len as i64)
            .iter()
            .map(|(_, s)| s.iter().product::<i64>() as f64)
            .sum(),
    }
}

/// Reads `--init` into a blank model of the right layout: every name, shape and dtype
/// checked, before any rank starts training (a rank that failed alone would leave the
/// others waiting in a collective).
pub fn check_init(cfg: &TrainConfig) -> Result<()> {
    let spec = match cfg.model.kind {
        ModelKind::Linear | ModelKind::TinyLm => return Ok(()),
        ModelKind::Resnet18 => ResNetSpec::resnet18(cfg.model.resnet.classes as i64),
        ModelKind::ResnetTiny => ResNetSpec::tiny(cfg.model.resnet.classes as i64),
    };
    match &cfg.model.init {
        Some(path) => ResNet::blank(spec).load_state(path),
        None => Ok(()),
    }
}

/// Each parameter's name and shape, without drawing or loading any value.
pub fn shapes(cfg: &TrainConfig) -> Result<Vec<(String, Vec<i64>)>> {
    let model = build(cfg, Device::Cpu, true)?;
    Ok(model.parameters().iter().map(|(n, t)| (n.clone(), t.size())).collect())
}

/// The model `cfg` names, in its dtype, on `device`, from `--init` or our seeded
/// initialisation (drawn on the CPU, as PyTorch draws it, then moved).
/// `blank`: every value will be overwritten before use, so skip drawing or loading them.
pub fn build(cfg: &TrainConfig, device: Device, blank: bool) -> Result<Box<dyn Model>> {
    let kind = cfg.precision.dtype.kind();
    let cast = Autocast(cfg.precision.amp.autocast());
    let spec = match cfg.model.kind {
        ModelKind::Linear => return Ok(Box::new(Linear::new(cfg.model.linear.features, kind, device, cast))),
        ModelKind::TinyLm => {
            let lm = &cfg.model.lm;
            return Ok(Box::new(TinyLm::new(lm.vocab, lm.seq_len, cfg.shape.seed, blank, kind, device, cast)));
        }
        ModelKind::Resnet18 => ResNetSpec::resnet18(cfg.model.resnet.classes as i64),
        ModelKind::ResnetTiny => ResNetSpec::tiny(cfg.model.resnet.classes as i64),
    };
    if blank {
        return Ok(Box::new(ResNet::blank(spec).to(kind, device).autocast(cast)));
    }
    let model = ResNet::new(spec, cfg.shape.seed);
    if let Some(path) = &cfg.model.init {
        model.load_state(path)?;
    }
    Ok(Box::new(model.to(kind, device).autocast(cast)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The count the memory check uses is the built model's, without building it.
    #[test]
    fn parameter_counts_match_the_built_models() {
        for model in [ModelKind::Linear, ModelKind::ResnetTiny, ModelKind::Resnet18, ModelKind::TinyLm] {
            for classes in [2, 10] {
                let mut cfg = TrainConfig::article();
                (cfg.model.kind, cfg.model.resnet.classes) = (model, classes);
                let built = build(&cfg, Device::Cpu, true).unwrap();
                let numel: i64 = built.parameters().iter().map(|(_, p)| p.numel() as i64).sum();
                assert_eq!(parameter_count(&cfg), numel as f64, "{model:?} with {classes} classes");
            }
        }
    }
}
