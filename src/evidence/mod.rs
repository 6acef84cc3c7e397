//! What the runs leave behind and what they are checked against: traces (per-step
//! gradients, final weights, buffers, allowances), saved as safetensors by one schema, and
//! the goldens real PyTorch recorded.

pub mod golden;
mod groups;
mod header;
mod keys;
mod load;
mod pair;
mod resample;
mod sampled;
pub mod schema;
mod stages;
mod torch_tested;
mod trace;
mod unrepeatable;
mod values;
pub(crate) mod words;
mod writer;

pub use golden::Golden;
pub use groups::Group;
pub use header::{
    DdpForward, Engine, Framework, HeaderProblem, Leg, Magnitudes, NormaliserScope, OptimizerKind, OptimizerRecord,
    RunKind, TraceHeader,
};
pub use pair::{BigLeg, Legs};
pub use sampled::{Sampled, Sampling, Summaries, Summary};
pub use stages::{Batch, Rows, StageStep, BATCH_FIELDS};
pub use torch_tested::{untested as torch_untested, TORCH_TESTED_UP_TO};
pub use trace::{Allowances, Params, RangePrediction, RankDrift, RankHeld, ScalerRecord, StepFacts, Trace};
pub use unrepeatable::Unrepeatable;
pub use values::{Data, Elem, Values, CHUNK};
pub use writer::TraceWriter;

/// What `--save-trace DIR` writes: both runs' traces and the JSON report.
pub const SAVED_FILES: [&str; 3] = ["accumulation.safetensors", "ddp.safetensors", "report.json"];

/// The control run's trace beside them, where one ran (`judge::control`): `compare DIR`
/// judges with it.
pub const CONTROL_FILE: &str = "control.safetensors";
/// The precision control's trace (`judge::precision`), beside the two `--save-trace` names.
pub const PRECISION_FILE: &str = "precision-control.safetensors";
/// The DDP leg's own precision control, where the legs reach their precision otherwise.
pub const PRECISION_DDP_FILE: &str = "precision-control-ddp.safetensors";
