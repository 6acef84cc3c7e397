//! The precision both runs compute in: the dtype of weights, gradients and optimizer state
//! (`--dtype`), and automatic mixed precision (`--amp`): what `torch.autocast` and
//! `torch.amp.GradScaler` do, in every run alike. Under AMP weights, gradients and optimizer
//! state stay float32; matrix products and convolutions compute in the autocast dtype;
//! float16 adds dynamic loss scaling.

use serde::{Deserialize, Serialize};

use ddp_verify_cli::defaults;

use super::{is_default, Amp, Dtype};

/// Flattened into `TrainConfig`'s JSON; absent keys are float32 without AMP.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Precision {
    #[serde(default, skip_serializing_if = "is_default")]
    pub dtype: Dtype,
    #[serde(flatten)]
    pub amp: AmpConfig,
}

/// Absent keys mean no AMP, so older goldens read as before.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AmpConfig {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub amp: Option<Amp>,
    /// GradScaler's `init_scale` (float16 only).
    #[serde(skip_serializing_if = "is_default_init_scale")]
    pub init_scale: f64,
    /// GradScaler's `growth_interval` (float16 only).
    #[serde(skip_serializing_if = "is_default_growth_interval")]
    pub growth_interval: u32,
    /// One micro-batch of this optimizer step (from 0) overflows: the last rank's first, whose
    /// loss is multiplied by [`OVERFLOW_FACTOR`] (float16 only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overflow_step: Option<usize>,
}

/// 2^40: any float16 backward through it overflows, and the loss scale stays a power of two.
pub const OVERFLOW_FACTOR: f64 = 1_099_511_627_776.0;

impl Default for AmpConfig {
    fn default() -> Self {
        AmpConfig {
            amp: None,
            init_scale: defaults::INIT_SCALE,
            growth_interval: defaults::GROWTH_INTERVAL,
            overflow_step: None,
        }
    }
}

impl AmpConfig {
    /// The autocast dtype, if any.
    #[cfg(feature = "libtorch")]
    pub fn autocast(&self) -> Option<tch::Kind> {
        use super::TchKind;
        self.amp.map(Amp::kind)
    }

    /// Whether a GradScaler scales the losses (float16 only, as PyTorch recommends).
    pub fn scaled(&self) -> bool {
        self.amp == Some(Amp::Float16)
    }
}

impl Precision {
    /// The flags that give this precision (defaults left out).
    pub(super) fn flags(&self, s: &mut String) {
        let a = &self.amp;
        if let Some(amp) = a.amp {
            s.push_str(&format!(" --amp {amp}"));
        }
        if a.init_scale != defaults::INIT_SCALE {
            s.push_str(&format!(" --init-scale {}", a.init_scale));
        }
        if a.growth_interval != defaults::GROWTH_INTERVAL {
            s.push_str(&format!(" --growth-interval {}", a.growth_interval));
        }
        if let Some(step) = a.overflow_step {
            s.push_str(&format!(" --overflow-step {step}"));
        }
        if self.dtype != Dtype::Float32 {
            s.push_str(&format!(" --dtype {}", self.dtype));
        }
    }
}

fn is_default_init_scale(v: &f64) -> bool {
    *v == defaults::INIT_SCALE
}
fn is_default_growth_interval(v: &u32) -> bool {
    *v == defaults::GROWTH_INTERVAL
}
