//! Where the runs compute: what the user asked for (`--device`) and what was chosen.

use serde::{Deserialize, Serialize};

use ddp_verify_cli::names;

/// Where both runs compute, as the ranks are told.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    #[default]
    Cpu,
    /// The accumulation run on `cuda:0`, DDP rank r on `cuda:<local rank>`.
    Cuda,
}

impl DeviceKind {
    pub fn name(self) -> &'static str {
        match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Cuda => "cuda",
        }
    }

    /// Where the accumulation run's tensors live.
    pub fn accumulation(self) -> tch::Device {
        match self {
            DeviceKind::Cpu => tch::Device::Cpu,
            DeviceKind::Cuda => tch::Device::Cuda(0),
        }
    }
}

/// `--device`: what the user asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceRequest {
    /// CUDA when a driver, a GPU for every local rank and NCCL are all present; else CPU.
    #[default]
    Auto,
    Cpu,
    Cuda,
}

impl DeviceRequest {
    pub fn parse(s: &str) -> Option<Self> {
        let i = names::DEVICES.iter().position(|&n| n == s)?;
        Some([DeviceRequest::Auto, DeviceRequest::Cpu, DeviceRequest::Cuda][i])
    }
}
