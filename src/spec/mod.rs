//! Plain data every stage receives: what to train, how closely to compare, which bug to
//! plant, where to compute and what to report. Nothing here computes or validates; the
//! values come from `lower.rs`, which checks them all once.

mod amp;
mod bug;
mod config;
mod device;
mod kernels;
mod optim;
mod report;
mod tolerance;
mod train;

pub use amp::{Amp, AmpConfig, OVERFLOW_FACTOR};
pub use bug::Bug;
pub use config::Config;
pub use device::{DeviceKind, DeviceRequest};
pub use kernels::{KernelFacts, KernelMode, Machine, Platform};
pub use optim::{OptimConfig, Optimizer, Schedule};
pub use report::{Format, ReportTarget};
pub use tolerance::{Tolerance, ToleranceOverrides};
pub use train::{Dtype, ModelKind, PartialWindow, TrainConfig};
