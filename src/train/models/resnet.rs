//! torchvision's ResNet (BasicBlock) in train mode, with PyTorch's `state_dict` names
//! (`conv1.weight`, `layer1.0.bn1.running_mean`, `layer2.0.downsample.0.weight`, `fc.bias`):
//! those names are how our traces meet PyTorch's. Each op is the ATen call torchvision's
//! modules make, so forward and backward round the same way.

use std::collections::BTreeMap;
use std::path::Path;

use tch::{Device, Kind, Reduction, Tensor};

use super::{Autocast, Model};
use crate::error::{Error, Result};
use crate::train::data::Batch;

/// Widths and blocks per stage; the stem (7x7 conv, stride 2, 3x3 max-pool) is fixed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResNetSpec {
    pub widths: [i64; 4],
    pub blocks: [usize; 4],
    pub num_classes: i64,
}

impl ResNetSpec {
    pub fn resnet18(num_classes: i64) -> Self {
        ResNetSpec { widths: [64, 128, 256, 512], blocks: [2, 2, 2, 2], num_classes }
    }

    /// One block per stage, widths 8-16-32-64 (~79k parameters): a full check runs in
    /// seconds on 2 cores.
    pub fn tiny(num_classes: i64) -> Self {
        ResNetSpec { widths: [8, 16, 32, 64], blocks: [1, 1, 1, 1], num_classes }
    }
}

impl ResNetSpec {
    /// Learnable values, counted without allocating them (for the memory check): the 7x7
    /// stem, two 3x3 convolutions per block, a 1x1 downsample where the shape changes,
    /// BatchNorm's weight and bias after each, and the classifier.
    pub fn parameter_count(&self) -> f64 {
        let w = self.widths.map(|x| x as f64);
        let (mut n, mut inplanes) = (3.0 * w[0] * 49.0 + 2.0 * w[0], w[0]);
        for (stage, (&planes, &blocks)) in w.iter().zip(&self.blocks).enumerate() {
            for b in 0..blocks {
                n += inplanes * planes * 9.0 + planes * planes * 9.0 + 4.0 * planes;
                if b == 0 && (stage > 0 || inplanes != planes) {
                    n += inplanes * planes + 2.0 * planes;
                }
                inplanes = planes;
            }
        }
        n + w[3] * self.num_classes as f64 + self.num_classes as f64
    }
}

/// BatchNorm2d's defaults.
const BN_MOMENTUM: f64 = 0.1;
const BN_EPS: f64 = 1e-5;

pub struct ResNet {
    spec: ResNetSpec,
    /// Trainable tensors, sorted by name.
    params: Vec<(String, Tensor)>,
    /// BatchNorm running statistics and `num_batches_tracked` (int64), sorted by name.
    buffers: Vec<(String, Tensor)>,
    index: BTreeMap<String, usize>,
    cast: Autocast,
}

impl ResNet {
    /// A seeded initialisation of our own, shaped like torchvision's (kaiming-normal
    /// fan_out convolutions, BatchNorm weight 1 and bias 0, PyTorch's Linear default). Random
    /// init cannot match torchvision's across languages: pass a state from PyTorch for that.
    pub fn new(spec: ResNetSpec, seed: u64) -> Self {
        crate::plan::rng::seeded(seed, || Self::init(spec, true))
    }

    /// The same shapes, all zero: for a DDP rank whose every value is overwritten before
    /// use (by the constructor's broadcast, or by lockstep's restart), so drawing resnet18's
    /// 11M random values there would be wasted.
    pub fn blank(spec: ResNetSpec) -> Self {
        Self::init(spec, false)
    }

    /// `random`: draw from the generator just seeded; else zeros.
    fn init(spec: ResNetSpec, random: bool) -> Self {
        let mut params = Vec::new();
        let mut buffers = Vec::new();
        let opts = (Kind::Float, Device::Cpu);
        // The random draws in torchvision's order, or zeros of the same shape when blank.
        let draw = |shape: &[i64], fill: &dyn Fn() -> Tensor| if random { fill() } else { Tensor::zeros(shape, opts) };
        let mut conv = |name: String, out: i64, inp: i64, k: i64| {
            let std = (2.0 / (out * k * k) as f64).sqrt();
            params.push((name, draw(&[out, inp, k, k], &|| Tensor::randn([out, inp, k, k], opts) * std)));
        };
        let mut bn_names = Vec::new();
        conv("conv1.weight".into(), spec.widths[0], 3, 7);
        bn_names.push(("bn1".to_string(), spec.widths[0]));
        let mut inplanes = spec.widths[0];
        for (stage, (&planes, &blocks)) in spec.widths.iter().zip(&spec.blocks).enumerate() {
            for b in 0..blocks {
                let p = format!("layer{}.{b}", stage + 1);
                conv(format!("{p}.conv1.weight"), planes, inplanes, 3);
                bn_names.push((format!("{p}.bn1"), planes));
                conv(format!("{p}.conv2.weight"), planes, planes, 3);
                bn_names.push((format!("{p}.bn2"), planes));
                if b == 0 && (stage > 0 || inplanes != planes) {
                    conv(format!("{p}.downsample.0.weight"), planes, inplanes, 1);
                    bn_names.push((format!("{p}.downsample.1"), planes));
                }
                inplanes = planes;
            }
        }
        let bound = 1.0 / (inplanes as f64).sqrt();
        let uniform = |shape: &[i64]| draw(shape, &|| Tensor::rand(shape, opts) * (2.0 * bound) - bound);
        params.push(("fc.weight".into(), uniform(&[spec.num_classes, inplanes])));
        params.push(("fc.bias".into(), uniform(&[spec.num_classes])));
        for (name, c) in bn_names {
            params.push((format!("{name}.weight"), Tensor::ones([c], opts)));
            params.push((format!("{name}.bias"), Tensor::zeros([c], opts)));
            buffers.push((format!("{name}.running_mean"), Tensor::zeros([c], opts)));
            buffers.push((format!("{name}.running_var"), Tensor::ones([c], opts)));
            buffers.push((format!("{name}.num_batches_tracked"), Tensor::zeros([], (Kind::Int64, Device::Cpu))));
        }
        params.sort_by(|a, b| a.0.cmp(&b.0));
        buffers.sort_by(|a, b| a.0.cmp(&b.0));
        let params = params.into_iter().map(|(n, t)| (n, t.set_requires_grad(true))).collect::<Vec<_>>();
        let index = params.iter().chain(&buffers).enumerate().map(|(i, (n, _))| (n.clone(), i)).collect();
        ResNet { spec, params, buffers, index, cast: Autocast::default() }
    }

    /// The same model in another floating dtype and on another device (`model.to(device,
    /// dtype)`); int64 buffers keep their dtype.
    pub fn to(self, kind: Kind, device: Device) -> Self {
        if kind == Kind::Float && device == Device::Cpu {
            return self;
        }
        let cast = |t: Tensor| {
            let kind = if t.is_floating_point() { kind } else { t.kind() };
            t.detach().to_device(device).to_kind(kind)
        };
        let params = self.params.into_iter().map(|(n, t)| (n, cast(t).set_requires_grad(true))).collect();
        let buffers = self.buffers.into_iter().map(|(n, t)| (n, cast(t))).collect();
        ResNet { params, buffers, ..self }
    }

    /// Forward passes under autocast (`--amp`).
    pub fn autocast(self, cast: Autocast) -> Self {
        ResNet { cast, ..self }
    }

    pub fn spec(&self) -> ResNetSpec {
        self.spec
    }

    /// Loads a PyTorch `state_dict` saved with safetensors (buffers included). Every name,
    /// shape and dtype must match; anything else is refused before training.
    pub fn load_state(&self, path: &Path) -> Result<()> {
        let fix = "save the model's state_dict with safetensors (see fixtures/resnet_check.py)";
        let file = Tensor::read_safetensors(path)
            .map_err(|e| Error::bad_file(path, format!("not a readable safetensors file ({e})"), fix))?;
        let mut given: BTreeMap<String, Tensor> = file.into_iter().collect();
        for (name, ours) in self.params.iter().chain(&self.buffers) {
            let t = given.remove(name).ok_or_else(|| Error::bad_file(path, format!("has no tensor {name}"), fix))?;
            if t.size() != ours.size() || t.kind() != ours.kind() {
                let problem = format!(
                    "{name} is {:?} {:?}, the model needs {:?} {:?}",
                    t.kind(),
                    t.size(),
                    ours.kind(),
                    ours.size()
                );
                return Err(Error::bad_file(path, problem, fix));
            }
            tch::no_grad(|| ours.shallow_clone().copy_(&t));
        }
        if let Some(extra) = given.keys().next() {
            return Err(Error::bad_file(path, format!("has {extra}, which this model does not"), fix));
        }
        Ok(())
    }

    /// Train-mode cross-entropy (mean over the micro-batch), updating BatchNorm's running
    /// statistics and `num_batches_tracked` as `model.train()` does.
    pub fn loss_of(&self, x: &Tensor, y: &Tensor) -> Tensor {
        self.cast.full(&self.forward(x)).cross_entropy_loss::<Tensor>(y, None, Reduction::Mean, -100, 0.0)
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        let mut x = self.bn(&self.conv(x, "conv1", 2, 3), "bn1").relu();
        x = x.max_pool2d([3, 3], [2, 2], [1, 1], [1, 1], false);
        let mut inplanes = self.spec.widths[0];
        for (stage, (&planes, &blocks)) in self.spec.widths.iter().zip(&self.spec.blocks).enumerate() {
            for b in 0..blocks {
                let stride = if stage > 0 && b == 0 { 2 } else { 1 };
                let p = format!("layer{}.{b}", stage + 1);
                let out = self.bn(&self.conv(&x, &format!("{p}.conv1"), stride, 1), &format!("{p}.bn1")).relu();
                let out = self.bn(&self.conv(&out, &format!("{p}.conv2"), 1, 1), &format!("{p}.bn2"));
                let identity = if b == 0 && (stage > 0 || inplanes != planes) {
                    self.bn(&self.conv(&x, &format!("{p}.downsample.0"), stride, 0), &format!("{p}.downsample.1"))
                } else {
                    x.shallow_clone()
                };
                x = (out + identity).relu();
                inplanes = planes;
            }
        }
        let x = x.adaptive_avg_pool2d([1, 1]).flatten(1, -1);
        let c = self.cast;
        c.low(&x).linear(&c.low(self.get("fc.weight")), Some(c.low(self.get("fc.bias"))))
    }

    fn get(&self, name: &str) -> &Tensor {
        let i = self.index[name];
        if i < self.params.len() {
            &self.params[i].1
        } else {
            &self.buffers[i - self.params.len()].1
        }
    }

    /// `conv2d` as ATen dispatches it, with cuDNN's choices pinned: no benchmarking, a
    /// deterministic algorithm, no TF32 (on the CPU these flags change nothing).
    fn conv(&self, x: &Tensor, name: &str, stride: i64, padding: i64) -> Tensor {
        let (x, w) = (self.cast.low(x), self.cast.low(self.get(&format!("{name}.weight"))));
        let (benchmark, deterministic, cudnn, tf32) = (false, true, true, false);
        x.internal_convolution::<Tensor>(
            &w,
            None,
            [stride, stride],
            [padding, padding],
            [1, 1],
            false,
            [0, 0],
            1,
            benchmark,
            deterministic,
            cudnn,
            tf32,
        )
    }

    /// `F.batch_norm(training=True)`: normalises with the micro-batch's statistics and updates
    /// the running ones in place; the module then counts the batch.
    fn bn(&self, x: &Tensor, name: &str) -> Tensor {
        let g = |s: &str| self.get(&format!("{name}.{s}"));
        let y = x.batch_norm(
            Some(g("weight")),
            Some(g("bias")),
            Some(g("running_mean")),
            Some(g("running_var")),
            true,
            BN_MOMENTUM,
            BN_EPS,
            false,
        );
        let _ = tch::no_grad(|| g("num_batches_tracked").shallow_clone().g_add_scalar_(1));
        y
    }
}

impl Model for ResNet {
    fn registration(&self) -> &'static [&'static str] {
        &["conv1", "bn1", "conv2", "bn2", "downsample", "layer1", "layer2", "layer3", "layer4", "fc", "weight", "bias"]
    }

    fn parameters(&self) -> &[(String, Tensor)] {
        &self.params
    }

    fn buffers(&self) -> &[(String, Tensor)] {
        &self.buffers
    }

    fn loss(&self, batch: &Batch) -> Tensor {
        let y = batch.y.as_ref().expect("ResNet data has labels");
        self.loss_of(&batch.x, y)
    }
}
