//! The facts a golden header records about the kernels (`--kernels`) and machine that
//! made its numbers.
//!
//! libtorch picks its kernels per CPU: ATen's vectorised loops by CPU capability (AVX2,
//! AVX-512), MKL's GEMM by code path, oneDNN's convolutions by ISA (AMX on new Intel CPUs).
//! Each sums in another order, so the bits of a run are bound to the CPU model, unless
//! those choices are pinned. `dist::kernels` pins them; `fixtures/kernels.py` does the same
//! for PyTorch.

use serde::{Deserialize, Serialize};

use super::KernelMode;

/// How a process computed: a golden header's `kernels`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelFacts {
    pub mode: KernelMode,
    /// ATen's, as `torch.backends.cpu.get_cpu_capability()` says it: DEFAULT, AVX2, AVX512.
    pub cpu_capability: String,
    /// Whether oneDNN (mkldnn) could be used (`torch.backends.mkldnn.enabled`).
    pub onednn: bool,
    /// MKL's conditional numerical reproducibility branch (`MKL_CBWR`), when set.
    pub mkl_cbwr: Option<String>,
    pub threads: usize,
}

/// Where a process computed: a golden header's `machine`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Machine {
    /// `/proc/cpuinfo`'s model name and vendor id.
    pub cpu: String,
    pub vendor: String,
    /// For CUDA: the GPU model, CUDA's and cuDNN's versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cudnn: Option<String>,
}

/// Both: what this process computes with, or what made a golden.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Platform {
    pub kernels: KernelFacts,
    pub machine: Machine,
}

impl Platform {
    /// "AMD EPYC (AuthenticAMD), ATen AVX2, oneDNN off, MKL_CBWR=COMPATIBLE, 1 thread".
    pub fn describe(&self) -> String {
        let k = &self.kernels;
        let gpu = self.machine.gpu.as_ref().map(|g| format!(", GPU {g}")).unwrap_or_default();
        format!(
            "{} ({}){gpu}, ATen {}, oneDNN {}, MKL_CBWR={}, {} thread{}",
            self.machine.cpu,
            self.machine.vendor,
            k.cpu_capability,
            if k.onednn { "on" } else { "off" },
            k.mkl_cbwr.as_deref().unwrap_or("unset"),
            k.threads,
            if k.threads == 1 { "" } else { "s" }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The header keys the reference scripts write (fixtures/kernels.py) read back.
    #[test]
    fn a_header_from_pytorch_reads() {
        let text = r#"{"kernels": {"mode": "portable", "cpu_capability": "AVX2", "onednn": false,
            "mkl_cbwr": "COMPATIBLE", "threads": 1}, "machine": {"cpu": "AMD EPYC", "vendor": "AuthenticAMD"}}"#;
        let p: Platform = serde_json::from_str(text).unwrap();
        assert_eq!(p.kernels.mode, KernelMode::Portable);
        assert_eq!(p.describe(), "AMD EPYC (AuthenticAMD), ATen AVX2, oneDNN off, MKL_CBWR=COMPATIBLE, 1 thread");
    }
}
