//! Flags, parsed once and turned into the library's validated `Config`. Only the binary
//! sees clap.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
// `ddp-verify` reads these flags' defaults before handing over to this binary.
use ddp_verify_launch::front;

use ddp_verify::config::ToleranceOverrides;
use ddp_verify::config::{Dtype, ModelKind};
use ddp_verify::device::{self, DeviceRequest};
use ddp_verify::explore::ExploreOptions;
use ddp_verify::inject::Bug;
use ddp_verify::report::{Format, ReportTarget};
use ddp_verify::runs::launch;
use ddp_verify::{Config, Error, TrainConfig};

const EXIT_CODES: &str =
    "Exit codes: 0 equivalent, 1 not equivalent, 2 bad usage or input, 3 a rank or the launcher failed.";

#[derive(Parser)]
#[command(
    name = "ddp-verify",
    version,
    about = "Proves that DDP over W ranks and gradient accumulation over K micro-batches give the same model.",
    args_conflicts_with_subcommands = true,
    after_help = EXIT_CODES
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Subcommand)]
pub enum Command {
    /// Print each rank's DistributedSampler indices and the accumulation order.
    Split(SplitArgs),
    /// Run many random configurations both ways on ranks started once; shrink failures.
    Explore(ExploreArgs),
    /// Show what --device can use here: CUDA driver and GPUs, NCCL, and what auto picks.
    Devices {
        /// DDP ranks that would share this machine.
        #[arg(long, default_value_t = 2)]
        gpus: usize,
    },
}

#[derive(Args)]
pub struct SplitShape {
    /// N: samples in the data set.
    #[arg(long, default_value_t = 8)]
    pub data_size: usize,
    /// W: DDP ranks (one per GPU, or one CPU process each).
    #[arg(long, default_value_t = front::DEFAULT_GPUS)]
    pub gpus: usize,
    /// B: micro-batch size per rank.
    #[arg(long, default_value_t = 4)]
    pub batch_size: usize,
    /// K: micro-batches per optimizer step in the single-device run; a multiple of --gpus.
    #[arg(long, default_value_t = 2)]
    pub acc_steps: usize,
    /// Shuffle with randperm seeded by seed + epoch, as DistributedSampler(shuffle=True).
    #[arg(long)]
    pub shuffle: bool,
    /// Drop the tail that does not divide evenly instead of padding by repetition.
    #[arg(long)]
    pub drop_last: bool,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub shape: SplitShape,
    /// D: input features of the linear model [default: --data-size, as in the article].
    #[arg(long)]
    pub features: Option<usize>,
    #[arg(long, default_value_t = 2)]
    pub epochs: usize,
    #[arg(long, default_value_t = 0.01)]
    pub lr: f64,
    #[arg(long, default_value_t = 0.9)]
    pub momentum: f64,
    #[command(flatten)]
    pub net: NetArgs,
    #[command(flatten)]
    pub tolerance: ToleranceArgs,
    /// Write DIR/accumulation.safetensors, DIR/ddp.safetensors and DIR/report.json.
    #[arg(long, value_name = "DIR")]
    pub save_trace: Option<PathBuf>,
    /// Also check both runs against PyTorch's traces in DIR (e.g. golden/article).
    #[arg(long, value_name = "DIR")]
    pub golden: Option<PathBuf>,
    /// Report format: table, json, markdown or junit; repeat for several.
    #[arg(long, value_name = "FORMAT", value_parser = parse_format)]
    pub report: Vec<Format>,
    /// File for the report at the same position (`-` = stdout); repeat in --report's order.
    #[arg(long, value_name = "PATH")]
    pub report_file: Vec<PathBuf>,
    /// Draw each comparison's per-step divergence (log scale, tolerance line) as SVG.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Record (or replace) the golden in --golden DIR from this run; refused when CI is set.
    #[arg(long, requires = "golden")]
    pub bless: bool,
    /// Seconds the DDP ranks may take before all are stopped (exit 3).
    #[arg(long, value_name = "SECONDS", default_value_t = front::DEFAULT_TIMEOUT_S)]
    pub timeout: f64,
    /// Let --save-trace replace existing files.
    #[arg(long)]
    pub force: bool,
    /// Plant a known bug in one run, to watch the gate fire.
    #[arg(long, value_name = "BUG", value_parser = parse_bug)]
    pub inject: Option<Bug>,
}

/// The model and how it is trained, beyond the sampling shape.
#[derive(Args)]
pub struct NetArgs {
    /// linear (the seed article's), resnet18 (torchvision's) or resnet-tiny (widths 8-16-32-64, one block per stage).
    #[arg(long, value_name = "MODEL", default_value = "linear", value_parser = parse_model)]
    pub model: ModelKind,
    /// S: ResNet inputs are S x S images (torch.rand(N, 3, S, S)).
    #[arg(long, default_value_t = 32)]
    pub image_size: usize,
    /// C: ResNet classes (labels torch.randint(0, C, (N,))).
    #[arg(long, default_value_t = 10)]
    pub classes: usize,
    #[arg(long, default_value_t = 0.0)]
    pub weight_decay: f64,
    /// Stop both runs after this many optimizer steps.
    #[arg(long, value_name = "M")]
    pub max_steps: Option<usize>,
    /// float32, float64, bfloat16 or float16, for data, model, gradients and optimizer (made in float32, then cast).
    #[arg(long, default_value = "float32", value_parser = parse_dtype)]
    pub dtype: Dtype,
    /// Restart DDP from the accumulation run's weights and buffers before every step [default for ResNets].
    #[arg(long, conflicts_with = "free_running")]
    pub lockstep: bool,
    /// Let both runs train on their own [default for the linear model]; deep nets drift in float32.
    #[arg(long)]
    pub free_running: bool,
    /// Initial ResNet state: a PyTorch state_dict saved with safetensors (BatchNorm buffers included).
    #[arg(long, value_name = "FILE.safetensors")]
    pub init: Option<PathBuf>,
    /// Count a BatchNorm buffer mismatch between the runs as NOT EQUIVALENT.
    #[arg(long)]
    pub strict_buffers: bool,
    /// SyncBatchNorm in the DDP run: refused, it is never equivalent to accumulation (see the message).
    #[arg(long)]
    pub sync_bn: bool,
    /// auto (CUDA when a driver, a GPU per rank and NCCL are present, else CPU), cpu, or cuda
    /// (accumulation on cuda:0, DDP rank r on cuda:<local rank>, NCCL all-reduce).
    #[arg(long, value_name = "DEVICE", default_value = "auto", value_parser = parse_device)]
    pub device: DeviceRequest,
}

#[derive(Args)]
pub struct ToleranceArgs {
    /// Largest distance in ulps (of the run's dtype) that counts as equal [default: 16].
    #[arg(long)]
    pub max_ulps: Option<u32>,
    /// Largest relative difference that counts as equal [default: 1e-6 for float32; float64: 2e-15 in lockstep, 1e-7 free-running; bfloat16 6.6e-2; float16 8.2e-3].
    #[arg(long)]
    pub rtol: Option<f64>,
    /// Absolute difference that counts as equal; only matters for values near zero [default: 1e-7; float64: 2e-16, 1e-10; bfloat16 6.6e-3; float16 8.2e-4].
    #[arg(long)]
    pub atol: Option<f64>,
}

impl ToleranceArgs {
    fn overrides(&self) -> ToleranceOverrides {
        ToleranceOverrides { max_ulps: self.max_ulps, rtol: self.rtol, atol: self.atol }
    }
}

fn parse_model(s: &str) -> Result<ModelKind, String> {
    ModelKind::parse(s).ok_or_else(|| format!("unknown model '{s}'; known: {}", ModelKind::NAMES.join(", ")))
}

fn parse_device(s: &str) -> Result<DeviceRequest, String> {
    DeviceRequest::parse(s).ok_or_else(|| format!("unknown device '{s}'; known: auto, cpu, cuda"))
}

fn parse_dtype(s: &str) -> Result<Dtype, String> {
    Dtype::parse(s).ok_or_else(|| format!("unknown dtype '{s}'; known: float32, float64, bfloat16, float16"))
}

#[derive(Args)]
pub struct ExploreArgs {
    /// Random configurations per pass (one pass per injected bug).
    #[arg(long, default_value_t = 100)]
    pub cases: usize,
    /// Largest W drawn; that many ranks are started once and reused.
    #[arg(long, default_value_t = 3)]
    pub max_gpus: usize,
    /// Draw configurations of: linear, resnet-tiny (lockstep in every dtype, and float64
    /// free-running), or all (a ResNet one draw in four).
    #[arg(long, value_name = "MODEL|all", default_value = "all")]
    pub model: String,
    /// Seed of the random draws [default: a fresh one, printed for replay].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Plant BUG in every case, or `all` for one pass per known bug: no-loss-scale,
    /// double-scale, contiguous-split, no-set-epoch, no-padding, stale-zero-grad.
    #[arg(long, value_name = "BUG|all")]
    pub inject: Option<String>,
    #[command(flatten)]
    pub tolerance: ToleranceArgs,
    /// Minimal failing configs are appended here and replayed first next time.
    #[arg(long, value_name = "FILE", default_value = "proptest-regressions/explore.txt")]
    pub regressions: PathBuf,
}

fn parse_format(s: &str) -> Result<Format, String> {
    Format::parse(s).ok_or_else(|| format!("unknown report format '{s}'; known: {}", Format::NAMES.join(", ")))
}

fn parse_bug(s: &str) -> Result<Bug, String> {
    Bug::parse(s).ok_or_else(|| {
        let names: Vec<&str> = Bug::ALL.iter().map(|b| b.name()).collect();
        format!("unknown bug '{s}'; known: {}", names.join(", "))
    })
}

#[derive(Args)]
pub struct SplitArgs {
    #[command(flatten)]
    pub shape: SplitShape,
    /// The epoch passed to set_epoch (changes the shuffle).
    #[arg(long, default_value_t = 0)]
    pub epoch: u64,
    /// Print JSON: {"shards": [...], "accumulation_order": [...], ...}.
    #[arg(long)]
    pub json: bool,
}

impl SplitShape {
    fn train(&self, features: Option<usize>, epochs: usize, lr: f64, momentum: f64) -> TrainConfig {
        TrainConfig {
            data_size: self.data_size,
            features: features.unwrap_or(self.data_size),
            seed: self.seed,
            epochs,
            batch_size: self.batch_size,
            acc_steps: self.acc_steps,
            gpus: self.gpus,
            lr,
            momentum,
            shuffle: self.shuffle,
            drop_last: self.drop_last,
            ..TrainConfig::article()
        }
    }
}

impl RunArgs {
    pub fn config(&self) -> Result<Config, Error> {
        if self.report_file.len() > self.report.len().max(1) {
            return Err(Error::bad_flag(
                "--report-file",
                format!("{} files for {} --report formats", self.report_file.len(), self.report.len()),
                "give one --report FORMAT for each --report-file, in the same order",
            ));
        }
        let formats = if self.report.is_empty() { vec![Format::Table] } else { self.report.clone() };
        let reports = formats
            .iter()
            .enumerate()
            .map(|(i, &format)| ReportTarget { format, path: self.report_file.get(i).cloned() })
            .collect();
        let n = &self.net;
        if n.sync_bn {
            return Err(Error::bad_flag(
                "--sync-bn",
                "SyncBatchNorm is never equivalent to accumulation: it normalises over all W ranks' micro-batches \
                 at once, accumulation over each micro-batch of --batch-size alone (and PyTorch's SyncBatchNorm \
                 refuses CPU tensors)",
                "drop --sync-bn; plain BatchNorm with DDP is what accumulation reproduces",
            ));
        }
        let train = TrainConfig {
            inject: self.inject,
            model: n.model,
            image_size: n.image_size,
            classes: n.classes,
            weight_decay: n.weight_decay,
            max_steps: n.max_steps,
            dtype: n.dtype,
            // Deep BatchNorm nets are chaotic in float32: lockstep unless asked otherwise.
            lockstep: n.lockstep || (n.model.is_resnet() && !n.free_running),
            init: n.init.clone(),
            ..self.shape.train(self.features, self.epochs, self.lr, self.momentum)
        };
        // Our own launcher puts all W ranks on this machine; a user's mpirun says how many.
        let local_ranks = if launch::inside_mpi_world() { device::local_size().unwrap_or(1) } else { train.gpus };
        let device = device::resolve(n.device, local_ranks)?;
        let train = TrainConfig { device: device.kind, ..train };
        Ok(Config {
            tolerance: self.tolerance.overrides().tolerance(train.dtype, train.lockstep),
            derive_bounds: self.tolerance.overrides().derive(&train),
            train,
            save_trace: self.save_trace.clone(),
            golden: self.golden.clone(),
            force: self.force,
            bless: self.bless,
            reports,
            timeout_s: self.timeout,
            plot: self.plot.clone(),
            strict_buffers: self.net.strict_buffers,
            device_note: device.note,
        })
    }
}

impl ExploreArgs {
    /// Every check happens here, before any rank starts.
    pub fn options(&self) -> Result<ExploreOptions, Error> {
        if self.cases == 0 {
            return Err(Error::bad_flag("--cases", "must be at least 1", "pass e.g. --cases 100"));
        }
        if self.max_gpus == 0 {
            return Err(Error::bad_flag("--max-gpus", "must be at least 1", "pass e.g. --max-gpus 3"));
        }
        let bugs = match self.inject.as_deref() {
            None => vec![None],
            Some("all") => Bug::ALL.into_iter().map(Some).collect(),
            Some(name) => {
                vec![Some(parse_bug(name).map_err(|e| Error::bad_flag("--inject", e, "pass one of those, or all"))?)]
            }
        };
        // Read and writable before any rank starts: a finding must not be lost at the end.
        ddp_verify::explore::read_regressions(Some(&self.regressions))?;
        ddp_verify::outputs::check_dir(
            "--regressions",
            self.regressions.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(std::path::Path::new(".")),
            true,
        )?;
        if self.regressions.is_dir() {
            return Err(Error::bad_file(
                &self.regressions,
                "--regressions names a directory, not a file",
                "pass a file path",
            ));
        }
        let tolerance = self.tolerance.overrides();
        for dtype in Dtype::ALL {
            tolerance.tolerance(dtype, false).validate()?;
        }
        let seed = self.seed.unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos() as u64)
        });
        let models = match self.model.as_str() {
            "all" => vec![ModelKind::Linear, ModelKind::ResnetTiny],
            "linear" => vec![ModelKind::Linear],
            "resnet-tiny" => vec![ModelKind::ResnetTiny],
            other => {
                return Err(Error::bad_flag(
                    "--model",
                    format!("explore draws linear or resnet-tiny configurations, not '{other}'"),
                    "pass --model linear, resnet-tiny or all",
                ))
            }
        };
        Ok(ExploreOptions {
            models,
            cases: self.cases,
            max_gpus: self.max_gpus,
            seed,
            bugs,
            tolerance,
            regressions: Some(self.regressions.clone()),
            progress: ddp_verify::runs::launch::progress_wanted(),
        })
    }
}

impl SplitArgs {
    pub fn train(&self) -> TrainConfig {
        let d = TrainConfig::article();
        self.shape.train(None, 1, d.lr, d.momentum)
    }
}
