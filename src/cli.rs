//! Flags, parsed once and turned into the library's validated `Config`. Only the binary
//! sees clap.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use ddp_verify::explore::ExploreOptions;
use ddp_verify::inject::Bug;
use ddp_verify::report::{Format, ReportTarget};
use ddp_verify::{Config, Error, Tolerance, TrainConfig};

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
    /// One DDP rank, started by ddp-verify itself under mpirun.
    #[command(name = "__rank", hide = true)]
    Rank {
        #[arg(long)]
        config: PathBuf,
        #[arg(long)]
        out: PathBuf,
    },
}

#[derive(Args)]
pub struct SplitShape {
    /// N: samples in the data set.
    #[arg(long, default_value_t = 8)]
    pub data_size: usize,
    /// W: DDP ranks (one per GPU, or one CPU process each).
    #[arg(long, default_value_t = 2)]
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
    #[arg(long, value_name = "SECONDS", default_value_t = 600.0)]
    pub timeout: f64,
    /// Let --save-trace replace existing files.
    #[arg(long)]
    pub force: bool,
    /// Plant a known bug in one run, to watch the gate fire.
    #[arg(long, value_name = "BUG", value_parser = parse_bug)]
    pub inject: Option<Bug>,
}

#[derive(Args)]
pub struct ToleranceArgs {
    /// Largest distance in float32 ulps that counts as equal.
    #[arg(long, default_value_t = Tolerance::default().max_ulps)]
    pub max_ulps: u32,
    /// Largest relative difference that counts as equal.
    #[arg(long, default_value_t = Tolerance::default().rtol)]
    pub rtol: f32,
    /// Absolute difference that counts as equal; only matters for values near zero.
    #[arg(long, default_value_t = Tolerance::default().atol)]
    pub atol: f32,
}

impl ToleranceArgs {
    fn tolerance(&self) -> Tolerance {
        Tolerance { max_ulps: self.max_ulps, rtol: self.rtol, atol: self.atol }
    }
}

#[derive(Args)]
pub struct ExploreArgs {
    /// Random configurations per pass (one pass per injected bug).
    #[arg(long, default_value_t = 100)]
    pub cases: usize,
    /// Largest W drawn; that many ranks are started once and reused.
    #[arg(long, default_value_t = 3)]
    pub max_gpus: usize,
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
            inject: None,
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
        Ok(Config {
            train: TrainConfig {
                inject: self.inject,
                ..self.shape.train(self.features, self.epochs, self.lr, self.momentum)
            },
            tolerance: self.tolerance.tolerance(),
            save_trace: self.save_trace.clone(),
            golden: self.golden.clone(),
            force: self.force,
            bless: self.bless,
            reports,
            timeout_s: self.timeout,
            plot: self.plot.clone(),
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
        let tolerance = self.tolerance.tolerance();
        tolerance.validate()?;
        let seed = self.seed.unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos() as u64)
        });
        Ok(ExploreOptions {
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
