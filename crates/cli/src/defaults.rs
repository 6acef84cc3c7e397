//! Every flag's default, once. The flags below use these; so do the library's article
//! configuration (`TrainConfig::article`), golden headers and the tests.

use crate::values::{DeviceRequest, Dtype, ModelKind, Optimizer, Pick, Schedule};

/// N: the seed article's 8 samples.
pub const DATA_SIZE: usize = 8;
/// W: two ranks, the article's `torchrun --nproc_per_node 2`.
pub const GPUS: usize = 2;
/// B: micro-batch size per rank.
pub const BATCH_SIZE: usize = 4;
/// K: micro-batches per optimizer step in the single-device run.
pub const ACC_STEPS: usize = 2;
pub const SEED: u64 = 0;
pub const EPOCHS: usize = 2;
pub const LR: f64 = 0.01;
pub const MOMENTUM: f64 = 0.9;
pub const WEIGHT_DECAY: f64 = 0.0;
pub const OPTIMIZER: Optimizer = Optimizer::Sgd;
/// AdamW's (β1, β2) and ε: torch.optim.AdamW's.
pub const BETAS: (f64, f64) = (0.9, 0.999);
pub const EPS: f64 = 1e-8;
pub const LR_SCHEDULE: Schedule = Schedule::Constant;
/// GradScaler's `init_scale` and `growth_interval` (`--amp float16`).
pub const INIT_SCALE: f64 = 65536.0;
pub const GROWTH_INTERVAL: u32 = 2000;
/// S: CIFAR-sized images.
pub const IMAGE_SIZE: usize = 32;
/// C: CIFAR-10's classes.
pub const CLASSES: usize = 10;
pub const MODEL: ModelKind = ModelKind::Linear;
/// V: tiny-lm's vocabulary.
pub const VOCAB: usize = 64;
/// T: tiny-lm's sequence length.
pub const SEQ_LEN: usize = 16;
/// Shortest tiny-lm sequence before padding.
pub const MIN_LEN: usize = 4;
pub const DTYPE: Dtype = Dtype::Float32;
pub const DEVICE: DeviceRequest = DeviceRequest::Auto;
/// Seconds the ranks of a verification may take.
pub const TIMEOUT_S: f64 = 600.0;
/// `-- COMMAND`: seconds a leg may go on once its trace is complete (training done) before
/// its processes are stopped and the trace judged: a rank hung in its process group's
/// teardown at exit loses no verdict.
pub const EXIT_GRACE_S: f64 = 30.0;
/// `split --epoch`.
pub const SPLIT_EPOCH: u64 = 0;
/// `explore --cases`.
pub const EXPLORE_CASES: usize = 100;
/// `explore --cases -- COMMAND`: each case runs a user's script two or three times.
pub const EXPLORE_SCRIPT_CASES: usize = 20;
/// `explore --max-gpus`.
pub const EXPLORE_MAX_GPUS: usize = 3;
/// `explore --model`.
pub const EXPLORE_MODEL: Pick<ModelKind> = Pick::All;
/// `explore --regressions`.
pub const REGRESSIONS: &str = "proptest-regressions/explore.txt";

/// A sampled trace keeps this many element positions of each tensor larger than that (the
/// recorder's `sample=` when `auto` samples; `--sample auto`).
pub const SAMPLE_SIZE: usize = 1024;
/// `sample="auto"` samples a model of more parameters than this and records a smaller one
/// whole: 4M float32 parameters make 16 MB a step.
pub const SAMPLE_FROM_PARAMETERS: usize = 4_000_000;
