//! How the runs go: how long, how they step and restart, which runs are made, and where
//! they compute.

use serde::{Deserialize, Serialize};

use ddp_verify_cli::defaults;

use super::{is_default, DeviceKind, ModelKind, PartialWindow};

/// Flattened into `TrainConfig`'s JSON; absent keys are the linear model's defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunShape {
    pub epochs: usize,
    /// Both runs stop after this many optimizer steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<usize>,
    /// Before every optimizer step the DDP run restarts from the accumulation run's weights
    /// and buffers, so each step's difference measures that step's arithmetic alone.
    #[serde(default, skip_serializing_if = "is_default")]
    pub lockstep: bool,
    /// What a window shorter than K at an epoch's end does.
    #[serde(default, skip_serializing_if = "is_default")]
    pub partial_window: PartialWindow,
    /// Also train the third run, one batch of all a step's samples, and compare
    /// accumulation with it. Not part of what a golden was made for.
    #[serde(default = "yes", skip_serializing_if = "is_yes")]
    pub big_batch: bool,
    /// Where both runs compute (`--device`, resolved before any rank starts).
    #[serde(default, skip_serializing_if = "is_default")]
    pub device: DeviceKind,
    /// CUDA with fewer GPUs (G) than ranks on a machine: rank r computes on
    /// `cuda:<local rank mod G>` and the all-reduce goes through host memory with Open MPI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_gpus: Option<usize>,
}

impl RunShape {
    /// The article's: two epochs, free-running on the CPU.
    pub fn article() -> Self {
        RunShape {
            epochs: defaults::EPOCHS,
            max_steps: None,
            lockstep: false,
            partial_window: PartialWindow::Carry,
            big_batch: true,
            device: DeviceKind::Cpu,
            shared_gpus: None,
        }
    }

    /// The flags that give these runs of `model`, whose defaults differ by model.
    pub(super) fn flags(&self, model: ModelKind, s: &mut String) {
        s.push_str(&format!(" --epochs {}", self.epochs));
        if let Some(m) = self.max_steps {
            s.push_str(&format!(" --max-steps {m}"));
        }
        if self.partial_window != PartialWindow::default_for(model) {
            s.push_str(&format!(" --partial-window {}", self.partial_window));
        }
        if !self.big_batch && model.has_big_batch() {
            s.push_str(" --no-big-batch");
        }
        if self.lockstep != model.is_deep() {
            s.push_str(if self.lockstep { " --lockstep" } else { " --free-running" });
        }
        if self.device != DeviceKind::Cpu {
            s.push_str(&format!(" --device {}", self.device));
        }
    }
}

fn yes() -> bool {
    true
}
fn is_yes(v: &bool) -> bool {
    *v
}
