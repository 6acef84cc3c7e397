//! What happens at the optimizer step (`--lr`, `--momentum`, `--weight-decay`,
//! `--optimizer`, `--clip-grad-norm`, `--lr-schedule`): once per step in every run, on the
//! accumulated and synchronised gradient.

use serde::{Deserialize, Serialize};

use ddp_verify_cli::defaults;

use super::{is_default, Optimizer, Schedule};

/// The optimizer step's settings. Flattened into `TrainConfig`'s JSON: absent keys but the
/// article's two are the defaults (SGD, no weight decay, no clipping, a constant learning
/// rate), so older goldens read as before.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OptimConfig {
    pub lr: f64,
    /// SGD's momentum (AdamW has none).
    pub momentum: f64,
    #[serde(default, skip_serializing_if = "is_default")]
    pub weight_decay: f64,
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

/// The flags' defaults: the article's SGD.
impl Default for OptimConfig {
    fn default() -> Self {
        OptimConfig {
            lr: defaults::LR,
            momentum: defaults::MOMENTUM,
            weight_decay: defaults::WEIGHT_DECAY,
            optimizer: defaults::OPTIMIZER,
            betas: defaults::BETAS,
            eps: defaults::EPS,
            clip_grad_norm: None,
            lr_schedule: defaults::LR_SCHEDULE,
        }
    }
}

impl OptimConfig {
    /// The article's step: SGD, no clipping, a constant learning rate (whatever the rate,
    /// momentum and weight decay).
    pub fn is_plain_sgd(&self) -> bool {
        let (lr, momentum, weight_decay) = (self.lr, self.momentum, self.weight_decay);
        *self == OptimConfig { lr, momentum, weight_decay, ..OptimConfig::default() }
    }

    /// The flags that give this step (the article's two always, the rest where not default).
    pub(super) fn flags(&self, s: &mut String) {
        s.push_str(&format!(" --lr {} --momentum {}", self.lr, self.momentum));
        if self.weight_decay != 0.0 {
            s.push_str(&format!(" --weight-decay {}", self.weight_decay));
        }
        if self.optimizer != Optimizer::Sgd {
            s.push_str(&format!(" --optimizer {}", self.optimizer));
        }
        if (self.betas, self.eps) != (defaults::BETAS, defaults::EPS) {
            s.push_str(&format!(" --betas {} {} --eps {}", self.betas.0, self.betas.1, self.eps));
        }
        if let Some(x) = self.clip_grad_norm {
            s.push_str(&format!(" --clip-grad-norm {x}"));
        }
        if self.lr_schedule != Schedule::Constant {
            s.push_str(&format!(" --lr-schedule {}", self.lr_schedule));
        }
    }
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
