//! What the commands other than a verification take, validated once by `lower.rs`:
//! `compare`'s, `explore`'s and `suite`'s options.

use std::path::PathBuf;

use super::{Bug, Config, KernelMode, ModelKind, ReportTarget, ToleranceOverrides};

/// `compare A B`.
#[derive(Clone)]
pub struct CompareOptions {
    /// The accumulation trace, then the DDP one (any two runs that should agree).
    pub paths: [PathBuf; 2],
    /// A big-batch trace, judged against the accumulation one.
    pub big: Option<PathBuf>,
    pub tolerance: ToleranceOverrides,
    pub reports: Vec<ReportTarget>,
    pub plot: Option<PathBuf>,
    pub strict_buffers: bool,
}

/// `explore`.
pub struct ExploreOptions {
    pub cases: usize,
    pub max_gpus: usize,
    /// The models configurations are drawn for (linear, resnet-tiny).
    pub models: Vec<ModelKind>,
    pub seed: u64,
    /// One pass per entry; `None` is the honest run.
    pub bugs: Vec<Option<Bug>>,
    /// --max-ulps/--rtol/--atol, if given; else each case is held to its derived bounds.
    pub tolerance: ToleranceOverrides,
    /// Minimal failing configurations, replayed first and appended to (proptest's idea of
    /// persisted regressions, stored as the configs themselves).
    pub regressions: Option<PathBuf>,
    pub progress: bool,
    /// Print the report as JSON instead of text.
    pub json: bool,
    /// The CPU kernels every case computes with.
    pub kernels: KernelMode,
}

/// `suite FILE.toml`: named verifications for a CI gate.
pub struct Suite {
    pub file: PathBuf,
    pub cases: Vec<SuiteCase>,
    pub reports: Vec<ReportTarget>,
    /// Every case must be done by then, or every rank is stopped (exit 3).
    pub timeout_s: f64,
    /// A line per case on stderr (a terminal).
    pub progress: bool,
}

pub struct SuiteCase {
    pub name: String,
    pub config: Config,
}

impl Suite {
    /// The ranks the suite starts: the most any case needs.
    pub fn ranks(&self) -> usize {
        self.cases.iter().map(|c| c.config.train.shape.gpus).max().unwrap_or(1)
    }
}

/// `ddp-verify --acc-steps K --gpus W -- python train.py ARGS`: a user's script as both legs.
#[derive(Clone)]
pub struct ScriptOptions {
    /// The command after `--`, read into its launcher, options and script.
    pub launcher: super::Launcher,
    pub acc_steps: usize,
    pub gpus: usize,
    /// B, what `{batch}` is in the accumulation and DDP legs (K·B in the big batch's).
    pub batch_size: usize,
    /// Where the legs' traces and logs go (--save-trace, or a fresh temporary directory).
    pub out: std::path::PathBuf,
    /// Each leg must finish within this many seconds.
    pub timeout: f64,
    /// `--sample`, for the legs' DDP_VERIFY_SAMPLE (None: the recorder's default).
    pub sample: Option<String>,
    /// How the two traces are judged and reported, as `compare` does.
    pub compare: CompareOptions,
    /// This machine's node where the DDP leg spans several (`launcher.nodes`); 0 on one.
    pub node_rank: usize,
    /// More placeholders and their values (`explore`'s {data_size}, {seed}, --axis), by
    /// name without braces.
    pub fills: Vec<(String, String)>,
    /// No progress lines (explore prints one per case).
    pub quiet: bool,
}

/// `explore -- COMMAND`: configurations drawn for a user's script, each run as
/// `ddp-verify -- COMMAND` runs it.
pub struct ScriptExplore {
    /// What every case shares (its K, W, B, output folder and fills are each case's).
    pub script: ScriptOptions,
    /// The command as given, placeholders and all: what a regression is kept under.
    pub command: Vec<String>,
    pub cases: usize,
    pub seed: u64,
    pub max_gpus: usize,
    pub max_time: Option<f64>,
    /// The placeholders the command takes: only those are drawn.
    pub takes: Takes,
    pub axes: Vec<Axis>,
    pub regressions: PathBuf,
    pub json: bool,
}

/// Which of the drawn placeholders a command takes.
#[derive(Clone, Copy, Debug, Default)]
pub struct Takes {
    pub batch: bool,
    pub data_size: bool,
    pub seed: bool,
}

/// `--axis NAME=V1,V2,...`: a user's own placeholder and its values, the first the simplest.
#[derive(Clone, Debug)]
pub struct Axis {
    pub name: String,
    pub values: Vec<String>,
}

/// `suite FILE.toml` whose cases run a user's script: each as `ddp-verify -- COMMAND`.
pub struct ScriptSuite {
    pub file: PathBuf,
    pub cases: Vec<ScriptCase>,
    pub reports: Vec<ReportTarget>,
}

pub struct ScriptCase {
    pub name: String,
    /// The command as the file gives it (placeholders and all).
    pub command: Vec<String>,
    pub options: ScriptOptions,
}
