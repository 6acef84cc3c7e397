//! ddp-verify: proves that data-parallel training (DDP) and gradient accumulation give the
//! same per-step gradients and final weights.
//!
//! Data flows one way: [`config::Config`] → [`sampler`] plan → the two [`runs`] emitting
//! [`trace::Trace`]s → [`compare`] → [`report`].

pub mod collective;
pub mod compare;
pub mod config;
pub mod data;
pub mod device;
pub mod error;
pub mod explore;
pub mod golden;
pub mod inject;
pub mod models;
pub mod optim;
pub mod outputs;
pub mod report;
pub mod runs;
pub mod sampler;
pub mod trace;
pub mod verify;

pub use config::{Config, Tolerance, TrainConfig};
/// Phase marks for `DDP_VERIFY_PROFILE` (bench/profile.sh).
pub use ddp_verify_launch::profile;
pub use error::{Error, Result};
