//! Everything a verification needs, validated once by `lower.rs`.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

use super::{ReportTarget, Tolerance, TrainConfig};

/// Everything a verification run needs, validated once.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Config {
    pub train: TrainConfig,
    /// The fixed tolerance: goldens are always held to it, the runs only when
    /// `derive_bounds` is off.
    pub tolerance: Tolerance,
    /// Hold accumulation vs DDP to the bounds derived from the arithmetic (no
    /// --max-ulps/--rtol/--atol given, and `TrainConfig::bounds_hold`).
    #[serde(default)]
    pub derive_bounds: bool,
    pub save_trace: Option<PathBuf>,
    pub golden: Option<PathBuf>,
    /// Allows `--save-trace` to replace files that already exist.
    pub force: bool,
    /// Record (or replace) the golden at `golden` from this run instead of checking it.
    pub bless: bool,
    /// Where each report goes; empty means the table on stdout.
    pub reports: Vec<ReportTarget>,
    /// The DDP ranks must finish within this many seconds, or all are stopped (exit 3).
    pub timeout_s: f64,
    /// `--plot FILE.svg`: per-step divergence on a log scale.
    pub plot: Option<PathBuf>,
    /// Count a BatchNorm buffer mismatch between the runs as NOT EQUIVALENT (by default it
    /// is reported as expected: DDP tracks rank 0's micro-batches, accumulation all K).
    #[serde(default)]
    pub strict_buffers: bool,
    /// Where the runs computed and why (`cpu (auto: no NVIDIA driver ...)`), for the report.
    #[serde(default)]
    pub device_note: String,
    /// The CPU kernels every rank computes with (`--kernels`, else the golden's, else portable).
    #[serde(default)]
    pub kernels: crate::spec::KernelMode,
}

impl Config {
    /// `train` judged as a verification judges it, writing nothing: what explore assembles
    /// for each case (`jobs::verify::assemble`).
    pub fn judging(train: TrainConfig, tolerance: Tolerance, derive_bounds: bool) -> Config {
        Config {
            train,
            tolerance,
            derive_bounds,
            save_trace: None,
            golden: None,
            force: false,
            bless: false,
            reports: Vec::new(),
            timeout_s: ddp_verify_cli::defaults::TIMEOUT_S,
            plot: None,
            strict_buffers: false,
            device_note: String::new(),
            kernels: crate::spec::KernelMode::default(),
        }
    }
}
