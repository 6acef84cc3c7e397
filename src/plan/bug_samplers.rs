//! The samplers a planted bug trains with instead of the right ones (`plan::steps` walks
//! them); what the bug then changes is `plan::bugs`.

use super::sampler::SamplerSpec;
use crate::spec::Bug;

/// When DDP ranks call `set_epoch`: each epoch, unless the bug forgets to.
pub fn sampler_epoch(bug: Option<Bug>, epoch: u64) -> u64 {
    if bug == Some(Bug::NoSetEpoch) {
        0
    } else {
        epoch
    }
}

/// The same padded index list as the strided shards, cut into W contiguous blocks instead
/// of taking every W-th index (the contiguous-split bug).
pub fn contiguous_blocks(strided: &[Vec<i64>]) -> Vec<Vec<i64>> {
    let mut flat = vec![0; strided.len() * strided[0].len()];
    for (r, shard) in strided.iter().enumerate() {
        for (i, &x) in shard.iter().enumerate() {
            flat[i * strided.len() + r] = x;
        }
    }
    flat.chunks(strided[0].len()).map(<[i64]>::to_vec).collect()
}

/// The shards as if DistributedSampler did not pad (the no-padding bug).
pub fn unpadded_shards(spec: &SamplerSpec, epoch: u64) -> Vec<Vec<i64>> {
    let padded = spec.shards(epoch);
    let total = spec.data_size;
    // The padded list is the permutation followed by repeats, and rank r holds its positions
    // r, r + W, ...: keep only positions below N.
    padded
        .iter()
        .enumerate()
        .map(|(r, shard)| {
            shard.iter().enumerate().filter(|(i, _)| i * spec.world + r < total).map(|(_, &x)| x).collect()
        })
        .collect()
}
