//! The one validated configuration every stage below the CLI receives.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

use crate::error::{Error, Result};
use crate::inject::Bug;
use crate::report::ReportTarget;

/// What to train and how to split it. Mirrors the seed article's flags.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    /// N: samples in the data set (`torch.rand(N, D)`).
    pub data_size: usize,
    /// D: input features of the linear model.
    pub features: usize,
    pub seed: u64,
    pub epochs: usize,
    /// B: micro-batch size, per rank in DDP and per micro-batch in accumulation.
    pub batch_size: usize,
    /// K: micro-batches per optimizer step in the single-device run.
    pub acc_steps: usize,
    /// W: DDP ranks.
    pub gpus: usize,
    pub lr: f64,
    pub momentum: f64,
    pub shuffle: bool,
    pub drop_last: bool,
    /// A known mistake planted in one run (`--inject`), to show the gate fires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inject: Option<Bug>,
}

/// When two float32 values count as the same. An element passes if any bound holds;
/// the absolute bound only matters for values near zero, so a 2x scaling bug never passes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Tolerance {
    pub max_ulps: u32,
    pub rtol: f32,
    pub atol: f32,
}

impl Default for Tolerance {
    /// Float32: a sum of W partial gradients in another order moves a few ulps at most.
    fn default() -> Self {
        Tolerance { max_ulps: 16, rtol: 1e-6, atol: 1e-7 }
    }
}

/// Everything a verification run needs, validated once.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Config {
    pub train: TrainConfig,
    pub tolerance: Tolerance,
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
}

impl TrainConfig {
    /// The article's defaults (`ddp.py`): lr 0.01, momentum 0.9, seed 0.
    pub fn article() -> Self {
        TrainConfig {
            data_size: 8,
            features: 8,
            seed: 0,
            epochs: 2,
            batch_size: 4,
            acc_steps: 2,
            gpus: 2,
            lr: 0.01,
            momentum: 0.9,
            shuffle: false,
            drop_last: false,
            inject: None,
        }
    }

    /// The `ddp-verify` command that reruns exactly this configuration.
    pub fn command(&self) -> String {
        let mut s = format!(
            "ddp-verify --data-size {} --features {} --batch-size {} --acc-steps {} --gpus {} --epochs {} --seed {} --lr {} --momentum {}",
            self.data_size, self.features, self.batch_size, self.acc_steps, self.gpus, self.epochs, self.seed, self.lr, self.momentum
        );
        for (on, flag) in [(self.shuffle, " --shuffle"), (self.drop_last, " --drop-last")] {
            if on {
                s.push_str(flag);
            }
        }
        if let Some(bug) = self.inject {
            s.push_str(" --inject ");
            s.push_str(bug.name());
        }
        s
    }

    /// Micro-batches each rank accumulates under no_sync before an all-reduce.
    pub fn local_acc_steps(&self) -> usize {
        self.acc_steps / self.gpus
    }

    /// Checks everything that can be checked before any process starts.
    pub fn validate(&self) -> Result<()> {
        self.validate_split()?;
        let steps = crate::sampler::optimizer_steps(self);
        if steps == 0 {
            return Err(Error::bad_flag(
                "--acc-steps",
                format!(
                    "no optimizer step would run: each rank gets {} micro-batch(es) per epoch over {} epoch(s), fewer than K/W = {}",
                    crate::sampler::batches_per_rank(self),
                    self.epochs,
                    self.local_acc_steps()
                ),
                "lower --acc-steps or --batch-size, or raise --data-size or --epochs",
            ));
        }
        Ok(())
    }

    /// The checks a sampling plan needs: sizes, and K a multiple of W.
    pub fn validate_split(&self) -> Result<()> {
        let positive = |flag: &'static str, v: usize| {
            if v == 0 {
                Err(Error::bad_flag(flag, "must be at least 1", format!("pass {flag} 1 or more")))
            } else {
                Ok(())
            }
        };
        positive("--gpus", self.gpus)?;
        positive("--acc-steps", self.acc_steps)?;
        positive("--batch-size", self.batch_size)?;
        positive("--epochs", self.epochs)?;
        positive("--data-size", self.data_size)?;
        positive("--features", self.features)?;
        if !self.acc_steps.is_multiple_of(self.gpus) {
            let lo = (self.acc_steps / self.gpus).max(1) * self.gpus;
            return Err(Error::bad_flag(
                "--acc-steps",
                format!(
                    "{} is not a multiple of --gpus {} (each rank accumulates K/W micro-batches)",
                    self.acc_steps, self.gpus
                ),
                format!("use --acc-steps {lo} or {}", lo + self.gpus),
            ));
        }
        if self.data_size < self.gpus {
            return Err(Error::bad_flag(
                "--data-size",
                format!("{} cannot give each of --gpus {} ranks a sample of its own", self.data_size, self.gpus),
                format!("use --data-size {} or more, or fewer --gpus", self.gpus),
            ));
        }
        for (flag, v) in [("--lr", self.lr), ("--momentum", self.momentum)] {
            if !v.is_finite() || v < 0.0 {
                return Err(Error::bad_flag(
                    flag,
                    format!("{v} is not a finite non-negative number"),
                    "pass e.g. 0.01",
                ));
            }
        }
        Ok(())
    }
}

impl Tolerance {
    pub fn validate(&self) -> Result<()> {
        for (flag, v) in [("--rtol", self.rtol), ("--atol", self.atol)] {
            if !v.is_finite() || v < 0.0 {
                return Err(Error::bad_flag(
                    flag,
                    format!("{v} is not a finite non-negative number"),
                    "pass e.g. 1e-6",
                ));
            }
        }
        Ok(())
    }
}

impl Config {
    pub fn validate(&self) -> Result<()> {
        if !(self.timeout_s.is_finite() && self.timeout_s > 0.0) {
            return Err(Error::bad_flag(
                "--timeout",
                format!("{} is not a positive number of seconds", self.timeout_s),
                "pass e.g. --timeout 600",
            ));
        }
        self.train.validate()?;
        self.tolerance.validate()
    }
}
