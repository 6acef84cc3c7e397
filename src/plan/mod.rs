//! Pure planning, before anything trains: the DistributedSampler port and the sampler that
//! mimics it, each run's step plan (windows, carry-over, --max-steps), the split that
//! `ddp-verify split` prints, and what a planted bug changes.

#[cfg(feature = "libtorch")]
pub mod bugs;
// Without libtorch only `split`'s checks run; the training configuration's are for our runs.
#[cfg_attr(not(feature = "libtorch"), allow(dead_code))]
pub mod checks;
pub mod dropout;
pub mod memory;
pub mod norm;
pub mod planted;
pub mod randperm;
#[cfg(feature = "libtorch")]
pub mod rng;
pub mod sampler;
pub mod schedule;
pub mod split;
pub mod steps;
#[cfg(feature = "libtorch")]
pub mod tokens;

#[cfg(feature = "libtorch")]
pub use bugs::Effect;
pub use norm::{Counts, Normaliser};
pub use planted::Planted;
pub use sampler::{batches_per_rank, optimizer_steps, steps_per_epoch, SamplerSpec};
pub use split::SplitPlan;
pub use steps::{RunPlan, StepPlan};
