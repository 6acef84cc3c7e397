//! What the runs leave behind and what they are checked against: traces (per-step
//! gradients, final weights, buffers, allowances), saved as safetensors, and the goldens
//! real PyTorch recorded.

pub mod golden;
mod trace;
mod writer;

pub use golden::Golden;
pub use trace::{sample, snapshot, Params, Trace};
pub use writer::TraceWriter;

/// What `--save-trace DIR` writes: both runs' traces and the JSON report.
pub const SAVED_FILES: [&str; 3] = ["accumulation.safetensors", "ddp.safetensors", "report.json"];
