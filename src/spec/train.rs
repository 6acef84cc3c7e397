//! What to train and how: the sampling shape, the model, the precision. Plain data, from
//! which every stage below takes what it needs; `lower.rs` fills and validates it.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

use ddp_verify_cli::defaults;

use super::{AmpConfig, Bug, DeviceKind, Dtype, ModelKind, OptimConfig, Optimizer, PartialWindow};

/// What to train and how to split it. Mirrors the seed article's flags.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    /// N: samples in the data set (`torch.rand(N, D)`).
    pub data_size: usize,
    /// D: input features of the linear model.
    pub features: usize,
    pub seed: u64,
    pub epochs: usize,
    /// B: micro-batch size, per rank in DDP and per micro-batch in accumulation.
    pub batch_size: usize,
    /// K: micro-batches per optimizer step in the single-device run.
    pub acc_steps: usize,
    /// W: DDP ranks.
    pub gpus: usize,
    pub lr: f64,
    pub momentum: f64,
    pub shuffle: bool,
    pub drop_last: bool,
    /// A known mistake planted in one run (`--inject`), to show the gate fires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inject: Option<Bug>,
    /// Fields below default to the linear model's values and are left out of JSON then, so
    /// linear goldens and reports read as before.
    #[serde(default, skip_serializing_if = "is_default")]
    pub model: ModelKind,
    /// S: images are S x S (`torch.rand(N, 3, S, S)`).
    #[serde(default = "default_image_size", skip_serializing_if = "is_default_image_size")]
    pub image_size: usize,
    /// C: classes (`torch.randint(0, C, (N,))`).
    #[serde(default = "default_classes", skip_serializing_if = "is_default_classes")]
    pub classes: usize,
    #[serde(default, skip_serializing_if = "is_default")]
    pub weight_decay: f64,
    /// Both runs stop after this many optimizer steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<usize>,
    #[serde(default, skip_serializing_if = "is_default")]
    pub dtype: Dtype,
    /// Before every optimizer step the DDP run restarts from the accumulation run's weights
    /// and buffers, so each step's difference measures that step's arithmetic alone.
    #[serde(default, skip_serializing_if = "is_default")]
    pub lockstep: bool,
    /// Initial state (a PyTorch `state_dict` in safetensors) instead of our seeded init.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init: Option<PathBuf>,
    /// Where both runs compute (`--device`, resolved before any rank starts).
    #[serde(default, skip_serializing_if = "is_default")]
    pub device: DeviceKind,
    /// CUDA with fewer GPUs (G) than ranks on a machine: rank r computes on
    /// `cuda:<local rank mod G>` and the all-reduce goes through host memory with Open MPI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_gpus: Option<usize>,
    /// V: tiny-lm's vocabulary (`torch.randint(0, V, (N, T))`).
    #[serde(default = "default_vocab", skip_serializing_if = "is_default_vocab")]
    pub vocab: usize,
    /// T: tiny-lm's sequence length, padding included.
    #[serde(default = "default_seq_len", skip_serializing_if = "is_default_seq_len")]
    pub seq_len: usize,
    /// Each sequence's length is drawn from [min_len, seq_len].
    #[serde(default = "default_min_len", skip_serializing_if = "is_default_min_len")]
    pub min_len: usize,
    /// What a window shorter than K at an epoch's end does.
    #[serde(default, skip_serializing_if = "is_default")]
    pub partial_window: PartialWindow,
    /// Also train the third run, one batch of all a step's samples, and compare
    /// accumulation with it. Not part of what a golden was made for.
    #[serde(default = "yes", skip_serializing_if = "is_yes")]
    pub big_batch: bool,
    /// tiny-lm's dropout probability at each block's two residual branches, masks keyed by
    /// sample (`plan::dropout`); 0 is none.
    #[serde(default, skip_serializing_if = "is_default")]
    pub dropout: f64,
    /// The optimizer, clipping and learning-rate schedule (`lr`, `momentum` and
    /// `weight_decay` above are theirs too).
    #[serde(flatten)]
    pub optim: OptimConfig,
    /// Autocast and loss scaling (`--amp`).
    #[serde(flatten)]
    pub amp: AmpConfig,
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}
fn default_image_size() -> usize {
    defaults::IMAGE_SIZE
}
fn is_default_image_size(v: &usize) -> bool {
    *v == default_image_size()
}
fn default_classes() -> usize {
    defaults::CLASSES
}
fn is_default_classes(v: &usize) -> bool {
    *v == default_classes()
}
fn yes() -> bool {
    true
}
fn is_yes(v: &bool) -> bool {
    *v
}
fn default_vocab() -> usize {
    defaults::VOCAB
}
fn is_default_vocab(v: &usize) -> bool {
    *v == defaults::VOCAB
}
fn default_seq_len() -> usize {
    defaults::SEQ_LEN
}
fn is_default_seq_len(v: &usize) -> bool {
    *v == defaults::SEQ_LEN
}
fn default_min_len() -> usize {
    defaults::MIN_LEN
}
fn is_default_min_len(v: &usize) -> bool {
    *v == defaults::MIN_LEN
}

impl TrainConfig {
    /// The article's configuration (`ddp.py`: lr 0.01, momentum 0.9, seed 0), which is
    /// every flag at its default.
    pub fn article() -> Self {
        TrainConfig {
            data_size: defaults::DATA_SIZE,
            // The article's D = N.
            features: defaults::DATA_SIZE,
            seed: defaults::SEED,
            epochs: defaults::EPOCHS,
            batch_size: defaults::BATCH_SIZE,
            acc_steps: defaults::ACC_STEPS,
            gpus: defaults::GPUS,
            lr: defaults::LR,
            momentum: defaults::MOMENTUM,
            shuffle: false,
            drop_last: false,
            inject: None,
            model: defaults::MODEL,
            image_size: defaults::IMAGE_SIZE,
            classes: defaults::CLASSES,
            weight_decay: defaults::WEIGHT_DECAY,
            max_steps: None,
            dtype: defaults::DTYPE,
            lockstep: false,
            init: None,
            device: DeviceKind::Cpu,
            shared_gpus: None,
            vocab: defaults::VOCAB,
            seq_len: defaults::SEQ_LEN,
            min_len: defaults::MIN_LEN,
            partial_window: PartialWindow::Carry,
            big_batch: true,
            dropout: 0.0,
            optim: OptimConfig::default(),
            amp: AmpConfig::default(),
        }
    }

    /// The `ddp-verify` command that reruns exactly this configuration.
    pub fn command(&self) -> String {
        let mut s = format!(
            "ddp-verify --data-size {} --features {} --batch-size {} --acc-steps {} --gpus {} --epochs {} --seed {} --lr {} --momentum {}",
            self.data_size, self.features, self.batch_size, self.acc_steps, self.gpus, self.epochs, self.seed, self.lr, self.momentum
        );
        for (on, flag) in [(self.shuffle, " --shuffle"), (self.drop_last, " --drop-last")] {
            if on {
                s.push_str(flag);
            }
        }
        if self.model.is_resnet() {
            s.push_str(&format!(
                " --model {} --image-size {} --classes {}",
                self.model.name(),
                self.image_size,
                self.classes
            ));
        }
        if self.model == ModelKind::TinyLm {
            s.push_str(&format!(
                " --model tiny-lm --vocab {} --seq-len {} --min-len {}",
                self.vocab, self.seq_len, self.min_len
            ));
        }
        if self.partial_window != PartialWindow::default_for(self.model) {
            s.push_str(&format!(" --partial-window {}", self.partial_window.name()));
        }
        if !self.big_batch && self.model.has_big_batch() {
            s.push_str(" --no-big-batch");
        }
        if self.dropout != 0.0 {
            s.push_str(&format!(" --dropout {}", self.dropout));
        }
        if self.weight_decay != 0.0 {
            s.push_str(&format!(" --weight-decay {}", self.weight_decay));
        }
        let o = &self.optim;
        if o.optimizer != Optimizer::Sgd {
            s.push_str(&format!(" --optimizer {}", o.optimizer.name()));
        }
        if (o.betas, o.eps) != (OptimConfig::default().betas, OptimConfig::default().eps) {
            s.push_str(&format!(" --betas {} {} --eps {}", o.betas.0, o.betas.1, o.eps));
        }
        if let Some(x) = o.clip_grad_norm {
            s.push_str(&format!(" --clip-grad-norm {x}"));
        }
        if o.lr_schedule != Default::default() {
            s.push_str(&format!(" --lr-schedule {}", o.lr_schedule));
        }
        if let Some(amp) = self.amp.amp {
            s.push_str(&format!(" --amp {}", amp.name()));
        }
        let a = &self.amp;
        if a.init_scale != AmpConfig::default().init_scale {
            s.push_str(&format!(" --init-scale {}", a.init_scale));
        }
        if a.growth_interval != AmpConfig::default().growth_interval {
            s.push_str(&format!(" --growth-interval {}", a.growth_interval));
        }
        if let Some(step) = a.overflow_step {
            s.push_str(&format!(" --overflow-step {step}"));
        }
        if let Some(m) = self.max_steps {
            s.push_str(&format!(" --max-steps {m}"));
        }
        if self.dtype != Dtype::Float32 {
            s.push_str(&format!(" --dtype {}", self.dtype.name()));
        }
        if self.lockstep != self.model.is_deep() {
            s.push_str(if self.lockstep { " --lockstep" } else { " --free-running" });
        }
        if self.device != DeviceKind::Cpu {
            s.push_str(&format!(" --device {}", self.device.name()));
        }
        if let Some(init) = &self.init {
            s.push_str(&format!(" --init {}", init.display()));
        }
        if let Some(bug) = self.inject {
            s.push_str(" --inject ");
            s.push_str(bug.name());
        }
        s
    }

    /// Whether the derived bounds are rigorous: both runs start every step from the same
    /// weights (lockstep), or the gradient does not depend on the weights (the linear
    /// model). A free-running deep net feeds each step's rounding into the next step's
    /// gradients, which no per-step bound follows; it keeps the fixed tolerance.
    pub fn bounds_hold(&self) -> bool {
        self.lockstep || !self.model.is_deep()
    }

    /// Whether the big-batch run is made and compared.
    pub fn with_big_batch(&self) -> bool {
        self.big_batch && self.model.has_big_batch() && self.amp.amp.is_none()
    }

    /// Micro-batches each rank accumulates under no_sync before an all-reduce.
    pub fn local_acc_steps(&self) -> usize {
        self.acc_steps / self.gpus
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Explore and suites send each case to the ranks as JSON: every float must come back
    /// bit for bit (a learning rate once came back 1 ulp off, and the ranks' models parted).
    #[test]
    fn a_config_survives_json_bit_for_bit() {
        let mut c = TrainConfig { lr: 0.011312096496120005, momentum: 0.1865353356759756, ..TrainConfig::article() };
        c.weight_decay = 0.002814535734954946;
        c.optim.eps = 1e-6;
        let back: TrainConfig = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
        assert_eq!((back.lr.to_bits(), back.momentum.to_bits()), (c.lr.to_bits(), c.momentum.to_bits()));
        assert_eq!(back, c);
    }
}
