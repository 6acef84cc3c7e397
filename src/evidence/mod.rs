//! What the runs leave behind and what they are checked against: traces (per-step
//! gradients, final weights, buffers, allowances), saved as safetensors, and the goldens
//! real PyTorch recorded.

pub mod golden;
mod trace;
mod writer;

pub use golden::Golden;
pub use trace::{sample, snapshot, Params, RangePrediction, RankDrift, ScalerRecord, Trace, TraceMeta};
pub use writer::TraceWriter;

/// The `format` a trace's header names: the layout `Trace` documents, version 1.
pub const TRACE_FORMAT: &str = "ddp-verify-trace/1";

/// What `--save-trace DIR` writes: both runs' traces and the JSON report.
pub const SAVED_FILES: [&str; 3] = ["accumulation.safetensors", "ddp.safetensors", "report.json"];
