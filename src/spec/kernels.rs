//! Which CPU kernels libtorch computes with (`--kernels`), and the facts a golden header
//! records about the kernels and machine that made its numbers.
//!
//! libtorch picks its kernels per CPU: ATen's vectorised loops by CPU capability (AVX2,
//! AVX-512), MKL's GEMM by code path, oneDNN's convolutions by ISA (AMX on new Intel CPUs).
//! Each sums in another order, so the bits of a run are bound to the CPU model, unless
//! those choices are pinned. `dist::kernels` pins them; `fixtures/kernels.py` does the same
//! for PyTorch.

use serde::{Deserialize, Serialize};

/// `--kernels`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KernelMode {
    /// ATen's AVX2 kernels, MKL's COMPATIBLE code path (SSE2 without the approximate
    /// reciprocals that differ between vendors), oneDNN off, one thread: the same bits on
    /// every x86-64 CPU with AVX2 and FMA of one vendor, and across Intel and AMD but for
    /// MKL's vector math (`sqrt`, `exp`, ...: `evidence::golden::for_vendor`).
    #[default]
    Portable,
    /// What this machine picks, one thread: faster, and bound to its CPU model.
    Native,
}

impl KernelMode {
    pub const ALL: [KernelMode; 2] = [KernelMode::Portable, KernelMode::Native];

    pub fn parse(s: &str) -> Option<Self> {
        KernelMode::ALL.into_iter().find(|k| k.name() == s)
    }

    pub fn name(self) -> &'static str {
        match self {
            KernelMode::Portable => "portable",
            KernelMode::Native => "native",
        }
    }

    /// The variables libtorch reads when it first dispatches, as this mode sets them.
    pub fn env(self) -> &'static [(&'static str, &'static str)] {
        match self {
            KernelMode::Portable => &[("ATEN_CPU_CAPABILITY", "avx2"), ("MKL_CBWR", "COMPATIBLE")],
            KernelMode::Native => &[],
        }
    }

    /// The ATen CPU capability this mode requires, if it pins one.
    pub fn capability(self) -> Option<&'static str> {
        match self {
            KernelMode::Portable => Some("AVX2"),
            KernelMode::Native => None,
        }
    }
}

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
    use ddp_verify_cli::names;

    #[test]
    fn modes_take_their_names_from_the_cli() {
        for (i, name) in names::KERNELS.iter().enumerate() {
            let mode = KernelMode::parse(name).unwrap();
            assert_eq!((mode as usize, mode.name()), (i, *name));
        }
        assert_eq!(KernelMode::parse("fast"), None);
    }

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
