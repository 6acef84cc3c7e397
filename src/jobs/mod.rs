//! The commands, each a short walk down the stages: `verify` (the main job), `explore`
//! (many random configurations on ranks started once), `split` (the sampling plan), and
//! `devices` (what --device can use).

pub mod compare;
pub mod explore;
mod pool;
pub mod suite;
pub mod verify;

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

/// `ddp-verify devices`: what `--device` can use here for `gpus` local ranks.
pub fn devices(gpus: usize) -> Result<Exit> {
    print!("{}", crate::dist::device::describe(gpus));
    Ok(Exit::Equivalent)
}
