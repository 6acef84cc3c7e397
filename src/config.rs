//! The one validated configuration every stage below the CLI receives.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

use crate::device::DeviceKind;
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
    /// Fields below default to the linear model's values and are left out of JSON then, so
    /// linear goldens and reports read as before.
    #[serde(default, skip_serializing_if = "is_default")]
    pub model: ModelKind,
    /// S: images are S x S (`torch.rand(N, 3, S, S)`).
    #[serde(default = "default_image_size", skip_serializing_if = "is_default_image_size")]
    pub image_size: usize,
    /// C: classes (`torch.randint(0, C, (N,))`).
    #[serde(default = "default_classes", skip_serializing_if = "is_default_classes")]
    pub classes: usize,
    #[serde(default, skip_serializing_if = "is_default")]
    pub weight_decay: f64,
    /// Both runs stop after this many optimizer steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<usize>,
    #[serde(default, skip_serializing_if = "is_default")]
    pub dtype: Dtype,
    /// Before every optimizer step the DDP run restarts from the accumulation run's weights
    /// and buffers, so each step's difference measures that step's arithmetic alone.
    #[serde(default, skip_serializing_if = "is_default")]
    pub lockstep: bool,
    /// Initial state (a PyTorch `state_dict` in safetensors) instead of our seeded init.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init: Option<PathBuf>,
    /// Where both runs compute (`--device`, resolved before any rank starts).
    #[serde(default, skip_serializing_if = "is_default")]
    pub device: DeviceKind,
}

/// Which network both runs train.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ModelKind {
    /// The seed article's `nn.Linear(D, 1, bias=False)`.
    #[default]
    Linear,
    Resnet18,
    ResnetTiny,
}

impl ModelKind {
    pub const NAMES: [&'static str; 3] = ["linear", "resnet18", "resnet-tiny"];

    pub fn name(self) -> &'static str {
        match self {
            ModelKind::Linear => "linear",
            ModelKind::Resnet18 => "resnet18",
            ModelKind::ResnetTiny => "resnet-tiny",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [ModelKind::Linear, ModelKind::Resnet18, ModelKind::ResnetTiny].into_iter().find(|m| m.name() == s)
    }

    pub fn is_resnet(self) -> bool {
        self != ModelKind::Linear
    }
}

/// The precision both runs compute in: data, weights, gradients and optimizer state alike
/// (`model.to(dtype)`, not autocast).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    #[default]
    Float32,
    Float64,
    Bfloat16,
    Float16,
}

impl Dtype {
    pub const ALL: [Dtype; 4] = [Dtype::Float32, Dtype::Float64, Dtype::Bfloat16, Dtype::Float16];

    pub fn name(self) -> &'static str {
        match self {
            Dtype::Float32 => "float32",
            Dtype::Float64 => "float64",
            Dtype::Bfloat16 => "bfloat16",
            Dtype::Float16 => "float16",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Dtype::ALL.into_iter().find(|d| d.name() == s)
    }

    pub fn kind(self) -> tch::Kind {
        match self {
            Dtype::Float32 => tch::Kind::Float,
            Dtype::Float64 => tch::Kind::Double,
            Dtype::Bfloat16 => tch::Kind::BFloat16,
            Dtype::Float16 => tch::Kind::Half,
        }
    }

    /// Machine epsilon, the spacing of values just above 1.
    pub fn epsilon(self) -> f64 {
        match self {
            Dtype::Float32 => f32::EPSILON as f64,
            Dtype::Float64 => f64::EPSILON,
            Dtype::Bfloat16 => 2f64.powi(-7),
            Dtype::Float16 => 2f64.powi(-10),
        }
    }
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}
fn default_image_size() -> usize {
    32
}
fn is_default_image_size(v: &usize) -> bool {
    *v == default_image_size()
}
fn default_classes() -> usize {
    10
}
fn is_default_classes(v: &usize) -> bool {
    *v == default_classes()
}

/// When two float32 values count as the same. An element passes if any bound holds;
/// the absolute bound only matters for values near zero, so a 2x scaling bug never passes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Tolerance {
    pub max_ulps: u32,
    pub rtol: f64,
    pub atol: f64,
}

impl Default for Tolerance {
    /// Float32: a sum of W partial gradients in another order moves a few ulps at most.
    fn default() -> Self {
        Tolerance::for_run(Dtype::Float32, true)
    }
}

impl Tolerance {
    /// Ulps count in the run's own precision.
    /// - float32: a reordered sum of partial gradients moves a few ulps.
    /// - float64 in lockstep, bfloat16 and float16: float32's bounds scaled by the ratio of
    ///   the epsilons (2^-29, 2^16, 2^13): the same reordering, rounded at another precision.
    /// - float64 free-running: deep BatchNorm nets amplify rounding from step to step (on
    ///   resnet-tiny a thousand-fold per step at 32x32 images, up to a million-fold with
    ///   3-sample micro-batches at 8x8: 1.3e-9 relative at step 1), so the bound is rel 1e-7,
    ///   good for about two steps, still ten times finer than float32's rounding; a real bug
    ///   (a scale, a stale or missing sample) moves gradients by 1e-3 or more at its first
    ///   step, 10^4 times the bound. Runs judged by derived bounds (`runs::Bounds`) do not
    ///   use these numbers.
    pub fn for_run(dtype: Dtype, lockstep: bool) -> Self {
        match (dtype, lockstep) {
            (Dtype::Float32, _) => Tolerance { max_ulps: 16, rtol: 1e-6, atol: 1e-7 },
            (Dtype::Float64, true) => Tolerance { max_ulps: 16, rtol: 2e-15, atol: 2e-16 },
            (Dtype::Float64, false) => Tolerance { max_ulps: 16, rtol: 1e-7, atol: 1e-10 },
            (Dtype::Bfloat16 | Dtype::Float16, _) => {
                let f32 = Tolerance::for_run(Dtype::Float32, lockstep);
                let ratio = dtype.epsilon() / Dtype::Float32.epsilon();
                Tolerance { rtol: f32.rtol * ratio, atol: f32.atol * ratio, ..f32 }
            }
        }
    }
}

/// `--max-ulps/--rtol/--atol` as given. Without any of them each element is held to the
/// bound the arithmetic gives it (`runs::Bounds`); any one given makes the fixed tolerance
/// decide instead, its other bounds at their defaults.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ToleranceOverrides {
    pub max_ulps: Option<u32>,
    pub rtol: Option<f64>,
    pub atol: Option<f64>,
}

impl ToleranceOverrides {
    pub fn given(&self) -> bool {
        self.max_ulps.is_some() || self.rtol.is_some() || self.atol.is_some()
    }

    /// The fixed tolerance: for goldens always, for the runs when overridden.
    pub fn tolerance(&self, dtype: Dtype, lockstep: bool) -> Tolerance {
        let d = Tolerance::for_run(dtype, lockstep);
        Tolerance {
            max_ulps: self.max_ulps.unwrap_or(d.max_ulps),
            rtol: self.rtol.unwrap_or(d.rtol),
            atol: self.atol.unwrap_or(d.atol),
        }
    }

    /// Whether accumulation vs DDP is judged by the derived bounds.
    pub fn derive(&self, train: &TrainConfig) -> bool {
        !self.given() && train.bounds_hold()
    }
}

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
            model: ModelKind::Linear,
            image_size: default_image_size(),
            classes: default_classes(),
            weight_decay: 0.0,
            max_steps: None,
            dtype: Dtype::Float32,
            lockstep: false,
            init: None,
            device: DeviceKind::Cpu,
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
        if self.model.is_resnet() {
            s.push_str(&format!(
                " --model {} --image-size {} --classes {}",
                self.model.name(),
                self.image_size,
                self.classes
            ));
        }
        if self.weight_decay != 0.0 {
            s.push_str(&format!(" --weight-decay {}", self.weight_decay));
        }
        if let Some(m) = self.max_steps {
            s.push_str(&format!(" --max-steps {m}"));
        }
        if self.dtype != Dtype::Float32 {
            s.push_str(&format!(" --dtype {}", self.dtype.name()));
        }
        if self.lockstep != self.model.is_resnet() {
            s.push_str(if self.lockstep { " --lockstep" } else { " --free-running" });
        }
        if self.device != DeviceKind::Cpu {
            s.push_str(&format!(" --device {}", self.device.name()));
        }
        if let Some(init) = &self.init {
            s.push_str(&format!(" --init {}", init.display()));
        }
        if let Some(bug) = self.inject {
            s.push_str(" --inject ");
            s.push_str(bug.name());
        }
        s
    }

    /// Whether the derived bounds are rigorous: both runs start every step from the same
    /// weights (lockstep), or the gradient does not depend on the weights (the linear
    /// model). A free-running deep net feeds each step's rounding into the next step's
    /// gradients, which no per-step bound follows; it keeps the fixed tolerance.
    pub fn bounds_hold(&self) -> bool {
        self.lockstep || !self.model.is_resnet()
    }

    /// Micro-batches each rank accumulates under no_sync before an all-reduce.
    pub fn local_acc_steps(&self) -> usize {
        self.acc_steps / self.gpus
    }

    /// Checks everything that can be checked before any process starts.
    pub fn validate(&self) -> Result<()> {
        self.validate_split()?;
        self.validate_resnet()?;
        if self.max_steps == Some(0) {
            return Err(Error::bad_flag(
                "--max-steps",
                "must be at least 1",
                "pass e.g. --max-steps 3, or leave it out",
            ));
        }
        if let Some(path) = self.init.as_deref().filter(|p| !p.is_file()) {
            return Err(Error::bad_file(
                path,
                format!("--init {}", crate::error::what_is(path)),
                "pass a state_dict saved with safetensors",
            ));
        }
        if self.init.is_some() && !self.model.is_resnet() {
            return Err(Error::bad_flag(
                "--init",
                "only the ResNets take an initial state",
                "drop --init or pass --model",
            ));
        }
        if self.drop_last && self.data_size < self.gpus {
            return Err(Error::bad_flag(
                "--drop-last",
                format!(
                    "with --data-size {} below --gpus {} every rank's shard is empty (DistributedSampler drops all samples), so no optimizer step would run",
                    self.data_size, self.gpus
                ),
                format!("drop --drop-last (torch then pads by repetition), or pass --data-size {} or more", self.gpus),
            ));
        }
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

    /// What only a ResNet needs: images and classes, and no micro-batch that would put a
    /// single value per channel through train-mode BatchNorm (PyTorch raises "Expected more
    /// than 1 value per channel when training").
    fn validate_resnet(&self) -> Result<()> {
        if !self.model.is_resnet() {
            return Ok(());
        }
        if self.image_size == 0 {
            return Err(Error::bad_flag("--image-size", "must be at least 1", "pass e.g. --image-size 32"));
        }
        if self.classes < 2 {
            return Err(Error::bad_flag("--classes", "must be at least 2", "pass e.g. --classes 10"));
        }
        // Tensor sizes are i64: a count past that would wrap (and slip past the memory check).
        if i64::try_from(self.classes).is_err() || i64::try_from(self.image_size).is_err() {
            let flag = if i64::try_from(self.classes).is_err() { "--classes" } else { "--image-size" };
            return Err(Error::bad_flag(flag, "is larger than any tensor can be", "pass a realistic size"));
        }
        let side = crate::models::smallest_feature_map(self.image_size);
        let shard = crate::sampler::SamplerSpec::from_train(self).num_samples();
        let smallest = match shard % self.batch_size {
            0 => self.batch_size.min(shard),
            r => r,
        };
        if smallest.saturating_mul(side).saturating_mul(side) == 1 {
            let why = if smallest == self.batch_size {
                format!("each micro-batch holds {smallest} sample")
            } else {
                format!(
                    "each rank's shard of {shard} samples ends in a micro-batch of 1 (--data-size {} over --gpus {} in batches of {})",
                    self.data_size, self.gpus, self.batch_size
                )
            };
            return Err(Error::bad_flag(
                "--batch-size",
                format!(
                    "{why} and at --image-size {} the last stage is 1x1, so train-mode BatchNorm would see one value per channel",
                    self.image_size
                ),
                "use micro-batches of 2 or more (change --batch-size or --data-size, or --drop-last), or a larger --image-size",
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
            let lo = (self.acc_steps / self.gpus).max(1).saturating_mul(self.gpus);
            return Err(Error::bad_flag(
                "--acc-steps",
                format!(
                    "{} is not a multiple of --gpus {} (each rank accumulates K/W micro-batches)",
                    self.acc_steps, self.gpus
                ),
                format!("use --acc-steps {lo} or {}", lo.saturating_add(self.gpus)),
            ));
        }
        // N < W is fine, as in torch: DistributedSampler pads by repeating the indices (or,
        // with drop_last, leaves every shard empty, which `validate` refuses as no step).
        for (flag, v) in [("--lr", self.lr), ("--momentum", self.momentum), ("--weight-decay", self.weight_decay)] {
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
