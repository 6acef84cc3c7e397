//! The flags, as clap sees them. Plain values only: lowering them into the library's
//! validated `Config` happens in `ddp-verify-core` (`src/lower.rs`).

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::values::{
    named, named_or_all, Amp, Bug, DeviceRequest, Dtype, Format, KernelMode, ModelKind, Optimizer, PartialWindow, Pick,
    Schedule,
};
use crate::{defaults as d, EXIT_CODES};

#[derive(Parser)]
#[command(
    name = "ddp-verify",
    // Whichever binary parses (the core, started by `ddp-verify`), help names the command typed.
    bin_name = "ddp-verify",
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
    /// Judge two recorded traces (from --save-trace or the ddp_verify_trace recorder) like a run.
    Compare(CompareArgs),
    /// Run the cases of a TOML file (CI gates); cases with the same W share ranks started once.
    Suite(SuiteArgs),
    /// Run your launch command once, recorded, and judge that one run by each stage's contract
    /// (no reference run): -- torchrun --nproc-per-node 8 train.py ARGS.
    Watch(WatchArgs),
    /// Show what this machine computes with (CPU, kernels, GPUs, NCCL, what --device auto picks) and
    /// check that its kernels repeat themselves for every model and dtype: a self-test for a new runner.
    Devices {
        /// DDP ranks that would share this machine.
        #[arg(long, default_value_t = d::GPUS)]
        gpus: usize,
        #[command(flatten)]
        kernels: KernelArgs,
    },
}

#[derive(Args)]
pub struct WatchArgs {
    #[command(flatten)]
    pub reports: ReportArgs,
    /// Keep the run's trace and log in DIR (watch.safetensors, watch.log); default: a fresh
    /// temporary directory.
    #[arg(long, value_name = "DIR")]
    pub save_trace: Option<PathBuf>,
    /// The run must finish within this many seconds, or every process is stopped (exit 3).
    #[arg(long, value_name = "SECONDS", default_value_t = d::TIMEOUT_S, value_parser = seconds)]
    pub timeout: f64,
    /// Seconds the run may go on once its trace is complete (a rank hung at exit) before it is
    /// stopped and its complete trace judged.
    #[arg(long, value_name = "SECONDS", default_value_t = d::EXIT_GRACE_S, value_parser = seconds)]
    pub exit_grace: f64,
    /// Stop every process of the run at the first optimizer step that breaks a contract
    /// (judged while it trains; rank 0 rewrites a small trace of the steps so far after each).
    #[arg(long)]
    pub stop_on_fault: bool,
    /// Let --save-trace and --report-file replace existing files.
    #[arg(long)]
    pub force: bool,
    /// Judge a run recorded before, in place of running a command: a DDP run's trace from
    /// `ddp_verify_trace.record(path)`, or a leg's `ddp.safetensors` kept by --save-trace.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["save_trace", "stop_on_fault", "script"])]
    pub trace: Option<PathBuf>,
    /// The launch command, exactly as you run it: -- torchrun --nproc-per-node 2 train.py ARGS
    /// (python, torchrun, accelerate launch, deepspeed).
    #[arg(last = true, required_unless_present = "trace", value_name = "COMMAND")]
    pub script: Vec<String>,
}

#[derive(Args)]
pub struct SplitShape {
    /// N: samples in the data set.
    #[arg(long, default_value_t = d::DATA_SIZE)]
    pub data_size: usize,
    /// W: DDP ranks (one per GPU, or one CPU process each).
    #[arg(long, default_value_t = d::GPUS)]
    pub gpus: usize,
    /// B: micro-batch size per rank.
    #[arg(long, default_value_t = d::BATCH_SIZE)]
    pub batch_size: usize,
    /// K: micro-batches per optimizer step in the single-device run; a multiple of --gpus.
    #[arg(long, default_value_t = d::ACC_STEPS)]
    pub acc_steps: usize,
    /// Shuffle with randperm seeded by seed + epoch, as DistributedSampler(shuffle=True).
    #[arg(long)]
    pub shuffle: bool,
    /// Drop the tail that does not divide evenly instead of padding by repetition.
    #[arg(long)]
    pub drop_last: bool,
    #[arg(long, default_value_t = d::SEED)]
    pub seed: u64,
}

#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub shape: SplitShape,
    /// D: input features of the linear model [default: --data-size, as in the article].
    #[arg(long)]
    pub features: Option<usize>,
    #[arg(long, default_value_t = d::EPOCHS)]
    pub epochs: usize,
    #[command(flatten)]
    pub net: NetArgs,
    #[command(flatten)]
    pub optim: OptimArgs,
    #[command(flatten)]
    pub amp: AmpArgs,
    #[command(flatten)]
    pub tolerance: ToleranceArgs,
    #[command(flatten)]
    pub kernels: KernelArgs,
    /// Write DIR/accumulation.safetensors, DIR/ddp.safetensors and DIR/report.json.
    #[arg(long, value_name = "DIR")]
    pub save_trace: Option<PathBuf>,
    /// Also check both runs against PyTorch's traces in DIR (e.g. golden/article).
    #[arg(long, value_name = "DIR")]
    pub golden: Option<PathBuf>,
    #[command(flatten)]
    pub reports: ReportArgs,
    /// Draw each comparison's per-step divergence (log scale, tolerance line) as SVG.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Record (or replace) the golden in --golden DIR from this run; refused when CI is set.
    #[arg(long, requires = "golden")]
    pub bless: bool,
    /// Seconds the DDP ranks may take before all are stopped (exit 3).
    #[arg(long, value_name = "SECONDS", default_value_t = d::TIMEOUT_S, value_parser = seconds)]
    pub timeout: f64,
    /// Let --save-trace replace existing files.
    #[arg(long)]
    pub force: bool,
    /// Plant a known bug in one run, to watch the gate fire.
    #[arg(long, value_name = "BUG", value_parser = named::<Bug>("bug"))]
    pub inject: Option<Bug>,
    /// `-- COMMAND` only: what the legs record of each tensor: full (whole), N (N elements of
    /// each tensor larger than N, and each whole tensor's sum, sum of squares and max |x|), or
    /// auto (whole up to 4M parameters, else 1024) [default: auto, or DDP_VERIFY_SAMPLE].
    #[arg(long, value_name = "N|full|auto", value_parser = sample)]
    pub sample: Option<String>,
    /// `-- COMMAND` only: every dropout of the run is the identity in every leg (modules,
    /// functional calls, attention's dropout_p), so that the rest of the script can be
    /// checked: each run would draw its own masks. Said in the report.
    #[arg(long)]
    pub no_dropout: bool,
    /// `-- COMMAND` only: seconds a leg may go on once its trace is complete before its
    /// processes are stopped (a rank hung at exit) and the trace judged, with a caution.
    #[arg(long, value_name = "SECONDS", default_value_t = d::EXIT_GRACE_S, value_parser = seconds)]
    pub exit_grace: f64,
    /// `-- torchrun --nnodes N ...` only: this machine's node. Node 0 runs the DDP leg's share
    /// and the other legs, and judges; any other runs its share of the DDP leg and exits
    /// [default: the command's --node-rank, else SLURM_NODEID].
    #[arg(long, value_name = "N")]
    pub node_rank: Option<usize>,
    /// Your training command, after `--` (`-- python train.py ARGS`): run as the accumulation
    /// leg (one process) and the DDP leg (torchrun, --gpus ranks), recorded with no edit and
    /// compared. In ARGS {acc_steps} is K, {local_acc_steps} this leg's micro-batches per step
    /// (K, or K/W), {gpus} W, {world} this leg's processes, {leg} accumulation or ddp.
    #[arg(last = true, value_name = "COMMAND")]
    pub script: Vec<String>,
}

/// The model and how it is trained, beyond the sampling shape.
#[derive(Args)]
pub struct NetArgs {
    /// The network both runs train.
    #[arg(long, value_name = "MODEL", default_value_t = d::MODEL, value_parser = named::<ModelKind>("model"))]
    pub model: ModelKind,
    /// S: ResNet inputs are S x S images (torch.rand(N, 3, S, S)).
    #[arg(long, default_value_t = d::IMAGE_SIZE)]
    pub image_size: usize,
    /// C: ResNet classes (labels torch.randint(0, C, (N,))).
    #[arg(long, default_value_t = d::CLASSES)]
    pub classes: usize,
    /// V: tiny-lm's vocabulary (token ids torch.randint(0, V, (N, T))).
    #[arg(long, default_value_t = d::VOCAB)]
    pub vocab: usize,
    /// T: tiny-lm's sequence length, padding included.
    #[arg(long, default_value_t = d::SEQ_LEN)]
    pub seq_len: usize,
    /// Shortest tiny-lm sequence: lengths are drawn from [--min-len, --seq-len], the rest padded.
    #[arg(long, default_value_t = d::MIN_LEN)]
    pub min_len: usize,
    /// A window of fewer than K micro-batches at an epoch's end [default: step for tiny-lm, else carry].
    #[arg(long, value_name = "POLICY", value_parser = named::<PartialWindow>("partial window"))]
    pub partial_window: Option<PartialWindow>,
    /// Require the third run, one batch of each step's K·B samples, compared with accumulation
    /// [default: on for linear and tiny-lm; refused for ResNets and under --amp].
    #[arg(long, conflicts_with = "no_big_batch")]
    pub big_batch: bool,
    /// Skip the big-batch run.
    #[arg(long)]
    pub no_big_batch: bool,
    /// tiny-lm: dropout probability after each block's attention and MLP, masks keyed by
    /// (seed, epoch, sample, layer) so every run draws the same ones.
    #[arg(long, value_name = "P", default_value_t = 0.0, allow_negative_numbers = true)]
    pub dropout: f64,
    /// Stop both runs after this many optimizer steps.
    #[arg(long, value_name = "M")]
    pub max_steps: Option<usize>,
    /// The precision of data, model, gradients and optimizer state (made in float32, then cast).
    #[arg(long, default_value_t = d::DTYPE, value_parser = named::<Dtype>("dtype"))]
    pub dtype: Dtype,
    /// Restart DDP from the accumulation run's weights and buffers before every step [default for ResNets and tiny-lm].
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
    /// Where both runs compute. With `-- COMMAND`, cpu runs a script that hard-codes CUDA and
    /// NCCL on the CPU with gloo (its calls mapped by the recorder, said in the report).
    #[arg(long, value_name = "DEVICE", default_value_t = d::DEVICE, value_parser = named::<DeviceRequest>("device"))]
    pub device: DeviceRequest,
}

/// What the optimizer step does, once per step in every run.
#[derive(Args)]
pub struct OptimArgs {
    #[arg(long, default_value_t = d::LR)]
    pub lr: f64,
    #[arg(long, default_value_t = d::MOMENTUM)]
    pub momentum: f64,
    #[arg(long, default_value_t = d::WEIGHT_DECAY)]
    pub weight_decay: f64,
    /// The optimizer both runs step with.
    #[arg(long, value_name = "OPTIMIZER", default_value_t = d::OPTIMIZER, value_parser = named::<Optimizer>("optimizer"))]
    pub optimizer: Optimizer,
    /// AdamW's β1 and β2 [default: 0.9 0.999].
    #[arg(long, num_args = 2, value_names = ["B1", "B2"], allow_negative_numbers = true)]
    pub betas: Option<Vec<f64>>,
    /// AdamW's ε.
    #[arg(long, default_value_t = d::EPS, allow_negative_numbers = true)]
    pub eps: f64,
    /// Clip the gradient's total 2-norm to X once per step, after accumulation and the
    /// all-reduce, before the optimizer (torch.nn.utils.clip_grad_norm_).
    #[arg(long, value_name = "X", allow_negative_numbers = true)]
    pub clip_grad_norm: Option<f64>,
    /// constant, warmup:N (lr·min(1, (s+1)/N)) or cosine:N (lr·(1+cos(π·min(s,N)/N))/2),
    /// ticking once per optimizer step (LambdaLR).
    #[arg(long, value_name = "SCHEDULE", default_value_t = d::LR_SCHEDULE)]
    pub lr_schedule: Schedule,
}

/// Automatic mixed precision: forward passes under autocast, weights, gradients and
/// optimizer state in float32 (`--dtype float32`), and for float16 GradScaler's dynamic loss
/// scaling, in every run alike.
#[derive(Args)]
pub struct AmpArgs {
    /// Run matrix products and convolutions in this dtype, as torch.autocast("cpu", dtype) runs them.
    #[arg(long, value_name = "DTYPE", value_parser = named::<Amp>("amp dtype"))]
    pub amp: Option<Amp>,
    /// float16: the loss scale the GradScaler starts from.
    #[arg(long, value_name = "S", default_value_t = d::INIT_SCALE, allow_negative_numbers = true)]
    pub init_scale: f64,
    /// float16: optimizer steps without inf/NaN after which the scale doubles.
    #[arg(long, value_name = "N", default_value_t = d::GROWTH_INTERVAL)]
    pub growth_interval: u32,
    /// float16: make one micro-batch of optimizer step S (from 0, as reports count) overflow, on the last DDP
    /// rank (its loss times 2^40): every rank, and the accumulation run, must skip the step.
    #[arg(long, value_name = "S")]
    pub overflow_step: Option<usize>,
}

/// Which CPU kernels libtorch computes with, the same for a run, `explore`, `suite` and `devices`.
#[derive(Args)]
pub struct KernelArgs {
    /// The CPU kernels libtorch computes with [default: the golden's, else portable].
    #[arg(long, value_name = "MODE", value_parser = named::<KernelMode>("kernel mode"))]
    pub kernels: Option<KernelMode>,
}

/// Where the verdict goes, the same for a run, `compare` and `suite`.
#[derive(Args)]
pub struct ReportArgs {
    /// Report format; repeat for several.
    #[arg(long, value_name = "FORMAT", value_parser = named::<Format>("report format"))]
    pub report: Vec<Format>,
    /// File for the report at the same position (`-` = stdout); repeat in --report's order.
    #[arg(long, value_name = "PATH")]
    pub report_file: Vec<PathBuf>,
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

#[derive(Args)]
pub struct ExploreArgs {
    /// Random configurations per pass (one pass per injected bug) [default: 100; 20 for a
    /// COMMAND after --].
    #[arg(long)]
    pub cases: Option<usize>,
    /// Largest W drawn; that many ranks are started once and reused.
    #[arg(long, default_value_t = d::EXPLORE_MAX_GPUS)]
    pub max_gpus: usize,
    /// Draw configurations of: linear, resnet-tiny (lockstep in every dtype, and float64
    /// free-running), tiny-lm, or all (linear three draws in five).
    #[arg(long, value_name = "MODEL|all", default_value_t = d::EXPLORE_MODEL, value_parser = named_or_all::<ModelKind>("model"))]
    pub model: Pick<ModelKind>,
    /// Seed of the random draws [default: a fresh one, printed for replay].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Plant BUG in every case, or `all` for one pass per known bug (each on the models that can carry it).
    #[arg(long, value_name = "BUG|all", value_parser = named_or_all::<Bug>("bug"))]
    pub inject: Option<Pick<Bug>>,
    #[command(flatten)]
    pub tolerance: ToleranceArgs,
    #[command(flatten)]
    pub kernels: KernelArgs,
    /// Minimal failing configs are appended here and replayed first next time.
    #[arg(long, value_name = "FILE", default_value = d::REGRESSIONS)]
    pub regressions: PathBuf,
    /// Print the summary as JSON (every tally, per bug) instead of text.
    #[arg(long)]
    pub json: bool,
    /// `-- COMMAND` only: stop drawing (and shrinking) after this many seconds; the cases
    /// run so far are reported.
    #[arg(long, value_name = "SECONDS", value_parser = seconds)]
    pub max_time: Option<f64>,
    /// `-- COMMAND` only: a placeholder of your own, {NAME} in the command, drawn from the
    /// values given (shrunk towards the first). Repeat for more.
    #[arg(long, value_name = "NAME=V1,V2,...")]
    pub axis: Vec<String>,
    /// `-- COMMAND` only: seconds each leg of a case may take before it is stopped.
    #[arg(long, value_name = "SECONDS", default_value_t = d::TIMEOUT_S, value_parser = seconds)]
    pub timeout: f64,
    /// Your training command, after `--`: configurations are drawn for it and each runs as
    /// `ddp-verify -- COMMAND` does. Besides {acc_steps}, {local_acc_steps}, {gpus},
    /// {world} and {batch}, it may take {data_size} (N, the samples it trains on) and {seed}.
    #[arg(last = true, value_name = "COMMAND")]
    pub script: Vec<String>,
}

#[derive(Args)]
pub struct CompareArgs {
    /// The accumulation trace (`.safetensors`), or a directory holding accumulation.safetensors and ddp.safetensors.
    #[arg(value_name = "A")]
    pub a: PathBuf,
    /// The DDP trace; leave out when A is a directory.
    #[arg(value_name = "B")]
    pub b: Option<PathBuf>,
    /// A third trace, one big batch of each step's samples in one process: accumulation is
    /// also judged against it (a per-micro-batch mean shows only there).
    #[arg(long, value_name = "FILE")]
    pub big_batch: Option<PathBuf>,
    /// A control trace: the accumulation run recorded again with DDP_VERIFY_PERTURB=X (the
    /// nudge a NOT EQUIVALENT report asks for). Runs that part after step 0 with no recorded
    /// fact apart are equivalent only within its measure of rounding.
    #[arg(long, value_name = "FILE")]
    pub control: Option<PathBuf>,
    #[command(flatten)]
    pub tolerance: ToleranceArgs,
    #[command(flatten)]
    pub reports: ReportArgs,
    /// Draw each comparison's per-step divergence (log scale, tolerance line) as SVG.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Count a BatchNorm buffer mismatch as NOT EQUIVALENT.
    #[arg(long)]
    pub strict_buffers: bool,
    /// Let --report-file and --plot replace existing files.
    #[arg(long)]
    pub force: bool,
}

#[derive(Args)]
pub struct SuiteArgs {
    /// The cases: `[[case]]` tables with a `name` and long flag names without dashes as keys.
    #[arg(value_name = "FILE.toml")]
    pub file: PathBuf,
    #[command(flatten)]
    pub reports: ReportArgs,
    #[command(flatten)]
    pub kernels: KernelArgs,
    /// Seconds the whole suite may take before every rank is stopped (exit 3).
    #[arg(long, value_name = "SECONDS", default_value_t = d::TIMEOUT_S, value_parser = seconds)]
    pub timeout: f64,
    /// Let --report-file replace existing files.
    #[arg(long)]
    pub force: bool,
}

#[derive(Args)]
pub struct SplitArgs {
    #[command(flatten)]
    pub shape: SplitShape,
    /// The epoch passed to set_epoch (changes the shuffle).
    #[arg(long, default_value_t = d::SPLIT_EPOCH)]
    pub epoch: u64,
    /// Print JSON: {"shards": [...], "accumulation_order": [...], ...}.
    #[arg(long)]
    pub json: bool,
}

/// `--sample`'s parser: `full`, `auto` or a positive whole number, as the recorder's
/// DDP_VERIFY_SAMPLE reads it.
fn sample(s: &str) -> Result<String, String> {
    match s {
        "full" | "auto" => Ok(s.to_string()),
        _ if s.parse::<usize>().is_ok_and(|n| n >= 1) => Ok(s.to_string()),
        _ => Err(format!("{s} is none of full, auto or a positive number of elements; pass e.g. --sample 1024")),
    }
}

/// `--timeout`'s parser, for a run and a suite alike: a positive number of seconds.
fn seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(t) if t.is_finite() && t > 0.0 => Ok(t),
        _ => Err(format!("{s} is not a positive number of seconds; pass e.g. --timeout 600")),
    }
}

/// What the launcher needs to start a verification's ranks itself.
#[derive(Debug, PartialEq)]
pub struct Verification {
    pub gpus: usize,
    pub timeout: Duration,
}

impl Verification {
    /// `Some` for the main command (no subcommand, no --help or --version) when these flags
    /// parse and give a usable --gpus and --timeout. Anything else goes to the core, which
    /// says what is wrong; rank 0 validates every flag before any training either way.
    pub fn of(args: &[OsString]) -> Option<Verification> {
        let cli =
            Cli::try_parse_from(std::iter::once(OsString::from("ddp-verify")).chain(args.iter().cloned())).ok()?;
        // A user's script starts its own processes (torchrun): the core runs it, no ranks.
        if cli.command.is_some() || !cli.run.script.is_empty() {
            return None;
        }
        let (gpus, timeout) = (cli.run.shape.gpus, cli.run.timeout);
        if gpus == 0 {
            return None;
        }
        // A timeout beyond what a Duration holds (1e20 s) is as good as none.
        Some(Verification { gpus, timeout: Duration::try_from_secs_f64(timeout).unwrap_or(Duration::MAX) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(line: &str) -> Option<Verification> {
        Verification::of(&line.split_whitespace().map(OsString::from).collect::<Vec<_>>())
    }

    fn ranks(gpus: usize, timeout: f64) -> Option<Verification> {
        Some(Verification { gpus, timeout: Duration::try_from_secs_f64(timeout).unwrap_or(Duration::MAX) })
    }

    #[test]
    fn verifications_are_started_by_the_launcher_with_their_gpus_and_timeout() {
        assert_eq!(of(""), ranks(d::GPUS, d::TIMEOUT_S));
        assert_eq!(of("--acc-steps 2 --gpus 2"), ranks(2, d::TIMEOUT_S));
        assert_eq!(of("--model=resnet-tiny --gpus=3 --timeout 20"), ranks(3, 20.0));
        assert_eq!(of("--shuffle --gpus 4 --lockstep --acc-steps 4"), ranks(4, d::TIMEOUT_S));
        assert_eq!(of("--model resnet18 --bless --golden g --lr 0.1"), ranks(2, d::TIMEOUT_S));
        assert_eq!(of("--timeout 1e30"), Some(Verification { gpus: 2, timeout: Duration::MAX }));
    }

    #[test]
    fn everything_else_goes_to_the_core() {
        for line in [
            "explore --cases 10",
            "split --gpus 3",
            "devices",
            "--model resnet18 --help",
            "--version",
            "-h",
            "--gpus 0",
            "--gpus two",
            "--gpus 2 --gpus 3",
            "--acc-steps 2 --gpus",
            "--timeout -1",
            "--timeout nan",
            "--model resnet18 stray",
            "--model resnet50",
        ] {
            assert_eq!(of(line), None, "{line}");
        }
    }

    #[test]
    fn the_flags_are_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn format_aliases_name_a_format() {
        let report = |v: &str| Cli::try_parse_from(["ddp-verify", "--report", v]).map(|c| c.run.reports.report);
        assert_eq!(report("md").unwrap(), [Format::Markdown]);
        assert!(report("html").unwrap_err().to_string().contains("known: table, json, markdown, junit"));
    }

    /// `--sample`'s help says what auto chooses, by the defaults the recorder uses.
    #[test]
    fn the_sample_help_says_the_auto_defaults() {
        use clap::CommandFactory;
        let cmd = Cli::command();
        let arg = cmd.get_arguments().find(|a| a.get_id() == "sample").expect("--sample");
        let help = arg.get_help().expect("help").to_string();
        let words =
            format!("whole up to {}M parameters, else {}", d::SAMPLE_FROM_PARAMETERS / 1_000_000, d::SAMPLE_SIZE);
        assert!(help.contains(&words), "{help}");
    }

    #[test]
    fn a_timeout_is_a_positive_number_of_seconds_wherever_it_is_given() {
        for bad in ["0", "-1", "nan", "inf", "x"] {
            let timeout = format!("--timeout={bad}");
            for line in [vec!["ddp-verify", &timeout], vec!["ddp-verify", "suite", "s.toml", &timeout]] {
                let err = Cli::try_parse_from(&line).err().unwrap_or_else(|| panic!("{line:?} accepted")).to_string();
                assert!(err.contains("--timeout") && err.contains("is not a positive number of seconds"), "{err}");
            }
        }
        assert_eq!(seconds("1e20"), Ok(1e20));
    }
}
