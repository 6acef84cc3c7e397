//! The network both runs train, and each model's own knobs: a part per model, so a new
//! model adds a part, not fields beside the others'.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use ddp_verify_cli::defaults;

use super::{is_default, ModelKind};

/// Flattened into `TrainConfig`'s JSON; a model's knobs are written only where they are
/// not their defaults, so linear goldens and reports read as before.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    #[serde(rename = "model", default, skip_serializing_if = "is_default")]
    pub kind: ModelKind,
    /// Initial state (a PyTorch `state_dict` in safetensors) instead of our seeded init.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init: Option<PathBuf>,
    #[serde(flatten)]
    pub linear: LinearConfig,
    #[serde(flatten)]
    pub resnet: ResnetConfig,
    #[serde(flatten)]
    pub lm: LmConfig,
}

/// The seed article's `nn.Linear(D, 1, bias=False)`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinearConfig {
    /// D: input features (`torch.rand(N, D)`); every config records it.
    pub features: usize,
}

/// ResNets' inputs and labels.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ResnetConfig {
    /// S: images are S x S (`torch.rand(N, 3, S, S)`).
    #[serde(skip_serializing_if = "is_default_image_size")]
    pub image_size: usize,
    /// C: classes (`torch.randint(0, C, (N,))`).
    #[serde(skip_serializing_if = "is_default_classes")]
    pub classes: usize,
}

/// tiny-lm's sequences and dropout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LmConfig {
    /// V: vocabulary (`torch.randint(0, V, (N, T))`).
    #[serde(skip_serializing_if = "is_default_vocab")]
    pub vocab: usize,
    /// T: sequence length, padding included.
    #[serde(skip_serializing_if = "is_default_seq_len")]
    pub seq_len: usize,
    /// Each sequence's length is drawn from [min_len, seq_len].
    #[serde(skip_serializing_if = "is_default_min_len")]
    pub min_len: usize,
    /// Dropout probability at each block's two residual branches, masks keyed by sample
    /// (`plan::dropout`); 0 is none.
    #[serde(skip_serializing_if = "is_default")]
    pub dropout: f64,
}

impl ModelConfig {
    /// The article's model: the linear one, D = N.
    pub fn article() -> Self {
        ModelConfig {
            kind: defaults::MODEL,
            init: None,
            linear: LinearConfig { features: defaults::DATA_SIZE },
            resnet: ResnetConfig::default(),
            lm: LmConfig::default(),
        }
    }

    /// The flags that give this model: D always (every config records it), the knobs of
    /// the model it is, and its initial state.
    pub(super) fn flags(&self, s: &mut String) {
        s.push_str(&format!(" --features {}", self.linear.features));
        if self.kind.is_resnet() {
            let r = &self.resnet;
            s.push_str(&format!(" --model {} --image-size {} --classes {}", self.kind, r.image_size, r.classes));
        }
        if self.kind == ModelKind::TinyLm {
            let l = &self.lm;
            s.push_str(&format!(
                " --model tiny-lm --vocab {} --seq-len {} --min-len {}",
                l.vocab, l.seq_len, l.min_len
            ));
        }
        if self.lm.dropout != 0.0 {
            s.push_str(&format!(" --dropout {}", self.lm.dropout));
        }
        if let Some(init) = &self.init {
            s.push_str(&format!(" --init {}", init.display()));
        }
    }
}

impl Default for ResnetConfig {
    fn default() -> Self {
        ResnetConfig { image_size: defaults::IMAGE_SIZE, classes: defaults::CLASSES }
    }
}

impl Default for LmConfig {
    fn default() -> Self {
        LmConfig { vocab: defaults::VOCAB, seq_len: defaults::SEQ_LEN, min_len: defaults::MIN_LEN, dropout: 0.0 }
    }
}

fn is_default_image_size(v: &usize) -> bool {
    *v == defaults::IMAGE_SIZE
}
fn is_default_classes(v: &usize) -> bool {
    *v == defaults::CLASSES
}
fn is_default_vocab(v: &usize) -> bool {
    *v == defaults::VOCAB
}
fn is_default_seq_len(v: &usize) -> bool {
    *v == defaults::SEQ_LEN
}
fn is_default_min_len(v: &usize) -> bool {
    *v == defaults::MIN_LEN
}
