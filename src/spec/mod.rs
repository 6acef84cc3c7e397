//! Plain data every stage receives: what to train, how closely to compare, which bug to
//! plant, where to compute and what to report. Nothing here computes or validates; the
//! values come from `lower.rs`, which checks them all once. The named values (models,
//! dtypes, bugs...) are `crates/cli`'s, re-exported; their libtorch side is here.

mod config;
#[cfg(feature = "libtorch")]
mod device;
#[cfg(feature = "libtorch")]
mod dtype;
mod explore;
mod kernels;
mod launcher;
mod model;
mod optim;
mod options;
mod precision;
mod report;
mod run;
mod shape;
mod tolerance;
mod train;

pub use config::Config;
/// The values flags name, defined once with their names in `crates/cli`.
pub use ddp_verify_cli::values::{
    Amp, Bug, DeviceKind, DeviceRequest, Dtype, Format, KernelMode, ModelKind, Models, Optimizer, PartialWindow,
    Schedule, Side,
};
#[cfg(feature = "libtorch")]
pub use device::accumulation_device;
#[cfg(feature = "libtorch")]
pub use dtype::TchKind;
pub use explore::{Axis, Draw, Exploration, ExploreOptions, ScriptExplore, Takes};
pub use kernels::{KernelFacts, Machine, Platform};
pub use launcher::{Launcher, LauncherKind};
pub use model::{LinearConfig, LmConfig, ModelConfig, ResnetConfig};
pub use optim::OptimConfig;
pub use options::{CompareOptions, ScriptCase, ScriptOptions, ScriptSuite, Suite, SuiteCase, WatchOptions};
pub use precision::{AmpConfig, Precision, OVERFLOW_FACTOR};
pub use report::ReportTarget;
pub use run::RunShape;
pub use shape::Shape;
pub use tolerance::{Tolerance, ToleranceOverrides};
pub use train::TrainConfig;

/// `skip_serializing_if` for a key at its type's default (0, false, None, the first value).
fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}
