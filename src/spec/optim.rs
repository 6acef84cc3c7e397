//! What happens at the optimizer step (`--optimizer`, `--clip-grad-norm`, `--lr-schedule`):
//! once per step in every run, on the accumulated and synchronised gradient.

use serde::{Deserialize, Serialize};

use ddp_verify_cli::defaults;

use super::{Optimizer, Schedule};

/// The optimizer step's settings. Flattened into `TrainConfig`'s JSON: absent keys are the
/// defaults (SGD, no clipping, a constant learning rate), so older goldens read as before.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OptimConfig {
    #[serde(default, skip_serializing_if = "is_default")]
    pub optimizer: Optimizer,
    /// AdamW's (β1, β2).
    #[serde(default = "default_betas", skip_serializing_if = "is_default_betas")]
    pub betas: (f64, f64),
    /// AdamW's ε, added to √v̂.
    #[serde(default = "default_eps", skip_serializing_if = "is_default_eps")]
    pub eps: f64,
    /// `clip_grad_norm_(params, X)` once per step, before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clip_grad_norm: Option<f64>,
    #[serde(default, skip_serializing_if = "is_default")]
    pub lr_schedule: Schedule,
}

impl Default for OptimConfig {
    fn default() -> Self {
        OptimConfig {
            optimizer: Optimizer::Sgd,
            betas: defaults::BETAS,
            eps: defaults::EPS,
            clip_grad_norm: None,
            lr_schedule: Schedule::Constant,
        }
    }
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}
fn default_betas() -> (f64, f64) {
    defaults::BETAS
}
fn is_default_betas(v: &(f64, f64)) -> bool {
    *v == defaults::BETAS
}
fn default_eps() -> f64 {
    defaults::EPS
}
fn is_default_eps(v: &f64) -> bool {
    *v == defaults::EPS
}
