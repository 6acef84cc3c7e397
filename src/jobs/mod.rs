//! The commands, each a short walk down the stages: `verify` (the main job), `explore`
//! (many random configurations, of our models on ranks started once or of a user's script),
//! `split` (the sampling plan), and `devices` (what --device can use).

pub mod compare;
#[cfg(feature = "libtorch")]
mod devices;
pub mod explore;
mod failure;
pub mod launcher;
#[cfg(feature = "libtorch")]
mod pool;
#[cfg(feature = "libtorch")]
mod preflight;
mod progress;
pub mod script;
pub mod script_suite;
#[cfg(feature = "libtorch")]
pub mod suite;
#[cfg(feature = "libtorch")]
pub mod verify;
pub mod watch;
pub mod workdir;

#[cfg(feature = "libtorch")]
pub use devices::devices;
#[cfg(feature = "libtorch")]
pub use preflight::preflight;

use crate::error::{Exit, Result};
use crate::plan::SplitPlan;
use crate::spec::TrainConfig;

/// `ddp-verify split`: each rank's shard and the accumulation order, as text or JSON.
pub fn split(train: &TrainConfig, epoch: u64, json: bool) -> Result<Exit> {
    let plan = SplitPlan::new(train, epoch);
    if json {
        println!("{}", serde_json::to_string(&plan).expect("plan serialises"));
    } else {
        print!("{}", plan.to_text());
    }
    Ok(Exit::Equivalent)
}
