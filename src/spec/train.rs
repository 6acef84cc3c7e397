//! What to train and how, in parts: the data and its split ([`Shape`]), the model and its
//! knobs ([`ModelConfig`]), the optimizer step ([`OptimConfig`]), the precision
//! ([`Precision`]), how the runs go ([`RunShape`]), and the bug planted, if any. Plain data,
//! from which every stage below takes what it needs; `lower.rs` fills and validates it.

use serde::{Deserialize, Serialize, Serializer};

use super::{Bug, ModelConfig, OptimConfig, Precision, RunShape, Shape};

/// What to train and how to split it. Written to JSON as one flat object (golden headers,
/// reports, the cases explore sends to its ranks), its parts' keys side by side.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct TrainConfig {
    #[serde(flatten)]
    pub shape: Shape,
    #[serde(flatten)]
    pub model: ModelConfig,
    /// The optimizer, its learning rate, momentum and weight decay, clipping and schedule.
    #[serde(flatten)]
    pub optim: OptimConfig,
    /// The dtype, autocast and loss scaling (`--dtype`, `--amp`).
    #[serde(flatten)]
    pub precision: Precision,
    #[serde(flatten)]
    pub run: RunShape,
    /// A known mistake planted in the runs (`--inject`), to show the gate fires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inject: Option<Bug>,
}

/// The order of the keys in JSON: the order they had when the configuration was one flat
/// struct, which golden headers and regression files were written in. A key left out here
/// is written after these.
const KEY_ORDER: [&str; 37] = [
    "data_size",
    "features",
    "seed",
    "epochs",
    "batch_size",
    "acc_steps",
    "gpus",
    "lr",
    "momentum",
    "shuffle",
    "drop_last",
    "inject",
    "model",
    "image_size",
    "classes",
    "weight_decay",
    "max_steps",
    "dtype",
    "lockstep",
    "init",
    "device",
    "shared_gpus",
    "vocab",
    "seq_len",
    "min_len",
    "partial_window",
    "big_batch",
    "dropout",
    "optimizer",
    "betas",
    "eps",
    "clip_grad_norm",
    "lr_schedule",
    "amp",
    "init_scale",
    "growth_interval",
    "overflow_step",
];

/// The parts as serde writes them, each part's keys its own way (defaults left out).
#[derive(Serialize)]
struct Parts<'a> {
    #[serde(flatten)]
    shape: &'a Shape,
    #[serde(flatten)]
    model: &'a ModelConfig,
    #[serde(flatten)]
    optim: &'a OptimConfig,
    #[serde(flatten)]
    precision: &'a Precision,
    #[serde(flatten)]
    run: &'a RunShape,
    #[serde(skip_serializing_if = "Option::is_none")]
    inject: &'a Option<Bug>,
}

impl Serialize for TrainConfig {
    /// The parts' keys, in [`KEY_ORDER`].
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{Error, SerializeMap};
        let parts = Parts {
            shape: &self.shape,
            model: &self.model,
            optim: &self.optim,
            precision: &self.precision,
            run: &self.run,
            inject: &self.inject,
        };
        let map = match serde_json::to_value(parts).map_err(S::Error::custom)? {
            serde_json::Value::Object(map) => map,
            _ => return Err(S::Error::custom("a configuration is an object")),
        };
        let rank = |k: &str| KEY_ORDER.iter().position(|o| *o == k).unwrap_or(KEY_ORDER.len());
        let mut keys: Vec<&String> = map.keys().collect();
        keys.sort_by_key(|k| rank(k));
        let mut out = s.serialize_map(Some(keys.len()))?;
        for key in keys {
            out.serialize_entry(key, &map[key])?;
        }
        out.end()
    }
}

impl TrainConfig {
    /// The article's configuration (`ddp.py`: lr 0.01, momentum 0.9, seed 0), which is
    /// every flag at its default.
    pub fn article() -> Self {
        TrainConfig {
            shape: Shape::article(),
            model: ModelConfig::article(),
            optim: OptimConfig::default(),
            precision: Precision::default(),
            run: RunShape::article(),
            inject: None,
        }
    }

    /// The `ddp-verify` command that reruns exactly this configuration, each part's flags
    /// in turn.
    pub fn command(&self) -> String {
        let mut s = "ddp-verify".to_string();
        self.shape.flags(&mut s);
        self.model.flags(&mut s);
        self.run.flags(self.model.kind, &mut s);
        self.optim.flags(&mut s);
        self.precision.flags(&mut s);
        if let Some(bug) = self.inject {
            s.push_str(&format!(" --inject {bug}"));
        }
        s
    }

    /// Whether the derived bounds are rigorous: both runs start every step from the same
    /// weights (lockstep), or the gradient does not depend on the weights (the linear
    /// model). A free-running deep net feeds each step's rounding into the next step's
    /// gradients, which no per-step bound follows; it keeps the fixed tolerance.
    pub fn bounds_hold(&self) -> bool {
        self.run.lockstep || !self.model.kind.is_deep()
    }

    /// Whether the big-batch run is made and compared.
    pub fn with_big_batch(&self) -> bool {
        self.run.big_batch && self.model.kind.has_big_batch() && self.precision.amp.amp.is_none()
    }

    /// Micro-batches each rank accumulates under no_sync before an all-reduce.
    pub fn local_acc_steps(&self) -> usize {
        self.shape.acc_steps / self.shape.gpus
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{Amp, AmpConfig, DeviceKind, Dtype, ModelKind, Optimizer, PartialWindow, Schedule};

    /// Explore and suites send each case to the ranks as JSON: every float must come back
    /// bit for bit (a learning rate once came back 1 ulp off, and the ranks' models parted).
    #[test]
    fn a_config_survives_json_bit_for_bit() {
        let mut c = TrainConfig::article();
        (c.optim.lr, c.optim.momentum) = (0.011312096496120005, 0.1865353356759756);
        c.optim.weight_decay = 0.002814535734954946;
        c.optim.eps = 1e-6;
        let back: TrainConfig = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
        assert_eq!(
            (back.optim.lr.to_bits(), back.optim.momentum.to_bits()),
            (c.optim.lr.to_bits(), c.optim.momentum.to_bits())
        );
        assert_eq!(back, c);
    }

    /// Every key set away from its default: the JSON is the flat configuration's, byte for
    /// byte (written by the code before the parts), and reads back whole.
    fn everything() -> TrainConfig {
        let mut c = TrainConfig::article();
        c.shape =
            Shape { data_size: 24, seed: 7, batch_size: 2, acc_steps: 4, gpus: 2, shuffle: true, drop_last: true };
        c.model.kind = ModelKind::TinyLm;
        c.model.init = Some("s.safetensors".into());
        c.model.linear.features = 3;
        (c.model.resnet.image_size, c.model.resnet.classes) = (16, 5);
        c.model.lm = crate::spec::LmConfig { vocab: 32, seq_len: 8, min_len: 2, dropout: 0.1 };
        c.optim = OptimConfig {
            lr: 0.05,
            momentum: 0.5,
            weight_decay: 0.01,
            optimizer: Optimizer::AdamW,
            betas: (0.8, 0.9),
            eps: 1e-6,
            clip_grad_norm: Some(1.0),
            lr_schedule: Schedule::Warmup(3),
        };
        let amp =
            AmpConfig { amp: Some(Amp::Float16), init_scale: 1024.0, growth_interval: 10, overflow_step: Some(1) };
        c.precision = Precision { dtype: Dtype::Float64, amp };
        c.run = RunShape {
            epochs: 3,
            max_steps: Some(5),
            lockstep: true,
            partial_window: PartialWindow::Step,
            big_batch: false,
            device: DeviceKind::Cuda,
            shared_gpus: Some(1),
        };
        c.inject = Some(Bug::ClipPerMicroBatch);
        c
    }

    #[test]
    fn the_json_is_the_flat_configurations_key_for_key() {
        let full = r#"{"data_size":24,"features":3,"seed":7,"epochs":3,"batch_size":2,"acc_steps":4,"gpus":2,"lr":0.05,"momentum":0.5,"shuffle":true,"drop_last":true,"inject":"clip-per-micro-batch","model":"tiny-lm","image_size":16,"classes":5,"weight_decay":0.01,"max_steps":5,"dtype":"float64","lockstep":true,"init":"s.safetensors","device":"cuda","shared_gpus":1,"vocab":32,"seq_len":8,"min_len":2,"partial_window":"step","big_batch":false,"dropout":0.1,"optimizer":"adamw","betas":[0.8,0.9],"eps":1e-6,"clip_grad_norm":1.0,"lr_schedule":"warmup:3","amp":"float16","init_scale":1024.0,"growth_interval":10,"overflow_step":1}"#;
        let article = r#"{"data_size":8,"features":8,"seed":0,"epochs":2,"batch_size":4,"acc_steps":2,"gpus":2,"lr":0.01,"momentum":0.9,"shuffle":false,"drop_last":false}"#;
        assert_eq!(serde_json::to_string(&everything()).unwrap(), full);
        assert_eq!(serde_json::to_string(&TrainConfig::article()).unwrap(), article);
        assert_eq!(serde_json::from_str::<TrainConfig>(full).unwrap(), everything());
        assert_eq!(serde_json::from_str::<TrainConfig>(article).unwrap(), TrainConfig::article());
        let keys = full.matches("\":").count();
        assert_eq!(keys, KEY_ORDER.len(), "a key of the parts is missing from KEY_ORDER");
    }

    /// A key missing that the flat configuration required is still refused.
    #[test]
    fn the_article_keys_are_required() {
        for key in ["data_size", "features", "epochs", "lr", "momentum", "drop_last"] {
            let mut v = serde_json::to_value(TrainConfig::article()).unwrap();
            v.as_object_mut().unwrap().remove(key);
            assert!(serde_json::from_value::<TrainConfig>(v).is_err(), "{key}");
        }
    }
}
