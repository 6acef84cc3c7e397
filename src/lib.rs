//! ddp-verify: proves that data-parallel training (DDP) and gradient accumulation give the
//! same per-step gradients and final weights.
//!
//! Data flows one way, each module using only those listed after it:
//! [`lower`] (flags → [`spec::Config`], every check) → [`jobs`] (the commands) →
//! [`report`] → [`judge`] (comparisons, bounds, verdict, diagnosis) → [`train`] (data,
//! models, SGD, the runs) → [`dist`] (collectives, MPI world, devices) → [`evidence`]
//! (traces, goldens) → [`plan`] (sampler, step plans, bug effects) → [`spec`] (plain data)
//! → [`error`], [`outputs`]. `tests/it/architecture.rs` holds the code to this order.

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
pub mod train;

/// Phase marks for `DDP_VERIFY_PROFILE` (bench/profile.sh).
pub use ddp_verify_launch::profile;
pub use error::{Error, Exit, Result};
pub use spec::{Config, Tolerance, TrainConfig};
