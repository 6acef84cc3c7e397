//! What happens at the optimizer step (`--optimizer`, `--clip-grad-norm`, `--lr-schedule`):
//! once per step in every run, on the accumulated and synchronised gradient.

use serde::{Deserialize, Serialize};

use ddp_verify_cli::defaults;

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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Optimizer {
    /// `torch.optim.SGD` with momentum and weight decay (libtorch's own C++ SGD).
    #[default]
    Sgd,
    /// `torch.optim.AdamW(foreach=False)`, its arithmetic op for op (`train::optim`).
    AdamW,
}

impl Optimizer {
    pub const ALL: [Optimizer; 2] = [Optimizer::Sgd, Optimizer::AdamW];

    pub fn name(self) -> &'static str {
        match self {
            Optimizer::Sgd => "sgd",
            Optimizer::AdamW => "adamw",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Optimizer::ALL.into_iter().find(|o| o.name() == s)
    }
}

/// The learning rate of optimizer step s is lr · f(s), ticking once per optimizer step
/// (`LambdaLR(opt, f)`, `scheduler.step()` after `optimizer.step()`).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Schedule {
    /// f(s) = 1.
    #[default]
    Constant,
    /// f(s) = min(1, (s + 1) / N).
    Warmup(usize),
    /// f(s) = (1 + cos(π · min(s, N) / N)) / 2.
    Cosine(usize),
}

impl Schedule {
    /// f(tick), in float64 as Python computes it.
    pub fn factor(self, tick: usize) -> f64 {
        match self {
            Schedule::Constant => 1.0,
            Schedule::Warmup(n) => (1.0f64).min((tick + 1) as f64 / n as f64),
            Schedule::Cosine(n) => 0.5 * (1.0 + (std::f64::consts::PI * tick.min(n) as f64 / n as f64).cos()),
        }
    }

    /// `constant`, `warmup:N` or `cosine:N` (N >= 1); None for anything else.
    pub fn parse(s: &str) -> Option<Self> {
        let steps = |n: &str| n.parse::<usize>().ok().filter(|&n| n >= 1);
        match s.split_once(':') {
            None if s == "constant" => Some(Schedule::Constant),
            Some(("warmup", n)) => steps(n).map(Schedule::Warmup),
            Some(("cosine", n)) => steps(n).map(Schedule::Cosine),
            _ => None,
        }
    }
}

impl std::fmt::Display for Schedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Schedule::Constant => write!(f, "constant"),
            Schedule::Warmup(n) => write!(f, "warmup:{n}"),
            Schedule::Cosine(n) => write!(f, "cosine:{n}"),
        }
    }
}

impl TryFrom<String> for Schedule {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        Schedule::parse(&s).ok_or_else(|| format!("unknown lr schedule '{s}'; known: constant, warmup:N, cosine:N"))
    }
}

impl From<Schedule> for String {
    fn from(s: Schedule) -> String {
        s.to_string()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_parse_print_and_tick_as_lambda_lr_would() {
        for s in ["constant", "warmup:3", "cosine:4"] {
            assert_eq!(Schedule::parse(s).map(|s| s.to_string()).as_deref(), Some(s));
        }
        for bad in ["warmup", "warmup:0", "cosine:x", "linear:3", ""] {
            assert_eq!(Schedule::parse(bad), None, "{bad}");
        }
        let warm: Vec<f64> = (0..4).map(|s| Schedule::Warmup(3).factor(s)).collect();
        assert_eq!(warm, [1.0 / 3.0, 2.0 / 3.0, 1.0, 1.0]);
        assert_eq!(Schedule::Cosine(4).factor(0), 1.0);
        assert_eq!(Schedule::Cosine(4).factor(4), 0.0);
        assert_eq!(Schedule::Cosine(4).factor(9), 0.0);
    }
}
