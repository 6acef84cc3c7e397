//! What the commands other than a verification take, validated once by `lower`:
//! `compare`'s, `suite`'s and a user's script's options (`explore`'s are in `explore.rs`).

use std::path::PathBuf;

use super::{Config, ReportTarget, ToleranceOverrides};

/// `compare A B`.
#[derive(Clone)]
pub struct CompareOptions {
    /// The accumulation trace, then the DDP one (any two runs that should agree).
    pub paths: [PathBuf; 2],
    /// A big-batch trace, judged against the accumulation one.
    pub big: Option<PathBuf>,
    /// A control trace: the accumulation run recorded again with its gradients nudged
    /// (`DDP_VERIFY_PERTURB`), which proves or refutes rounding where the runs part after
    /// step 0 with no recorded fact apart.
    pub control: Option<PathBuf>,
    /// The precision control's trace: the accumulation run recorded again with DDP's loss
    /// divisor (`DDP_VERIFY_DIVISOR`), which measures a narrow dtype's rounding.
    pub precision: Option<PathBuf>,
    /// The DDP leg's own precision control, where the legs reach their precision otherwise.
    pub precision_ddp: Option<PathBuf>,
    pub tolerance: ToleranceOverrides,
    pub reports: Vec<ReportTarget>,
    pub plot: Option<PathBuf>,
    pub strict_buffers: bool,
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

/// `ddp-verify watch -- COMMAND`: a user's launch command run once, as written, and judged
/// by each stage's contract.
pub struct WatchOptions {
    /// `--trace`: a run recorded before, judged in place of running `command` (then empty).
    pub recorded: Option<PathBuf>,
    pub command: Vec<String>,
    /// The Python that runs the script (beside the launcher), which must import the recorder.
    pub python: String,
    /// Where the trace and the log go (--save-trace, or a fresh temporary directory).
    pub out: PathBuf,
    pub timeout: f64,
    pub exit_grace: f64,
    /// `--stop-on-fault`: judge each step while the run trains, and stop it at the first
    /// broken one.
    pub stop_on_fault: bool,
    pub reports: Vec<ReportTarget>,
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
    /// `--no-dropout`: every leg runs with every dropout the identity.
    pub no_dropout: bool,
    /// `--device cpu`: a script's hard-coded CUDA and NCCL run on the CPU with gloo.
    pub cpu: bool,
    /// `--exit-grace`: seconds a leg may go on once its trace is complete.
    pub exit_grace: f64,
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
