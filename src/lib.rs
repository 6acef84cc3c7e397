//! ddp-verify: proves that data-parallel training (DDP) and gradient accumulation give the
//! same per-step gradients and final weights.
//!
//! Data flows one way, each module using only those listed after it: [`dispatch`] (the
//! commands without libtorch, for both binaries) → [`lower`] (flags → [`spec::Config`], every check) → [`jobs`] (the commands) →
//! [`report`] → [`judge`] (comparisons, bounds, verdict, diagnosis) → [`train`] (data,
//! models, SGD, the runs) → [`dist`] (collectives, MPI world, devices) → [`bounds`] (what
//! an optimizer makes of an allowance, without tensors) → [`evidence`]
//! (traces, goldens) → [`plan`] (sampler, step plans, bug effects) → [`spec`] (plain data)
//! → [`error`], [`outputs`]. `tests/it/architecture.rs` holds the code to this order.
//!
//! Only `train` and `dist` (and the commands that run them) need libtorch, behind the
//! default `libtorch` feature; without it the library still reads, writes and judges traces
//! and checks users' scripts, as the wheel's `ddp-verify` does.

pub mod bounds;
pub mod dispatch;
#[cfg(feature = "libtorch")]
pub mod dist;
pub mod error;
pub mod evidence;
pub mod jobs;
pub mod judge;
pub mod lower;
pub mod outputs;
pub mod plan;
pub mod report;
pub mod spec;
#[cfg(feature = "libtorch")]
pub mod train;

/// Phase marks for `DDP_VERIFY_PROFILE` (bench/profile.sh).
pub use ddp_verify_launch::profile;
pub use error::{Error, Exit, Result};
pub use spec::{Config, Tolerance, TrainConfig};
