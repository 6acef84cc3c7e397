//! `split`'s flags: the sampling plan, which needs nothing but the shape.

use ddp_verify_cli::SplitArgs;

use super::shape;
use crate::error::Result;
use crate::plan;
use crate::spec::TrainConfig;

/// `split`'s flags: the sampling shape and the epoch, checked, and the plan's size.
pub fn split(args: &SplitArgs) -> Result<(TrainConfig, u64)> {
    let mut train = TrainConfig { shape: shape(&args.shape), ..TrainConfig::article() };
    (train.model.linear.features, train.run.epochs) = (args.shape.data_size, 1);
    plan::checks::check_split(&train)?;
    plan::memory::check_split_fits(&train, plan::memory::available_bytes)?;
    Ok((train, args.epoch))
}
