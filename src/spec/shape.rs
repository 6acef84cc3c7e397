//! The data set and how the ranks split it: what `DistributedSampler` and the sampler that
//! mimics it need (`ddp-verify split` takes nothing else).

use serde::{Deserialize, Serialize};

use ddp_verify_cli::defaults;

/// N, B, K, W and the sampler's seed and options. Mirrors the seed article's flags.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Shape {
    /// N: samples in the data set (`torch.rand(N, D)`).
    pub data_size: usize,
    pub seed: u64,
    /// B: micro-batch size, per rank in DDP and per micro-batch in accumulation.
    pub batch_size: usize,
    /// K: micro-batches per optimizer step in the single-device run.
    pub acc_steps: usize,
    /// W: DDP ranks.
    pub gpus: usize,
    pub shuffle: bool,
    pub drop_last: bool,
}

impl Shape {
    /// The article's: every flag at its default.
    pub fn article() -> Self {
        Shape {
            data_size: defaults::DATA_SIZE,
            seed: defaults::SEED,
            batch_size: defaults::BATCH_SIZE,
            acc_steps: defaults::ACC_STEPS,
            gpus: defaults::GPUS,
            shuffle: false,
            drop_last: false,
        }
    }

    /// The flags that give this shape.
    pub(super) fn flags(&self, s: &mut String) {
        s.push_str(&format!(
            " --data-size {} --batch-size {} --acc-steps {} --gpus {} --seed {}",
            self.data_size, self.batch_size, self.acc_steps, self.gpus, self.seed
        ));
        for (on, flag) in [(self.shuffle, " --shuffle"), (self.drop_last, " --drop-last")] {
            if on {
                s.push_str(flag);
            }
        }
    }
}
