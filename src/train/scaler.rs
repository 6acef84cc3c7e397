//! `torch.amp.GradScaler` for `--amp float16`, op for op as PyTorch's CPU kernels run it: the
//! loss times a float32 scale (`scaler.scale(loss)`), gradients unscaled in place by
//! `scale.double().reciprocal().float()` with a check for inf/NaN
//! (`_amp_foreach_non_finite_check_and_unscale_`), the step skipped when any was found, and
//! the scale backed off or grown by ATen's own `_amp_update_scale_`. In DDP each rank checks
//! the gradients after the all-reduce, so every rank finds the same and skips alike.

use tch::{Device, Kind, Tensor};

use crate::error::Result;
use crate::spec::TrainConfig;

/// GradScaler's defaults, which `--amp float16` keeps.
const GROWTH_FACTOR: f64 = 2.0;
const BACKOFF_FACTOR: f64 = 0.5;

pub struct Scaler {
    /// float32, 0-dim, as `torch.full((), init_scale)`.
    scale: Tensor,
    /// int32, 0-dim: steps since the last inf/NaN or growth.
    growth_tracker: Tensor,
    growth_interval: i64,
}

impl Scaler {
    /// A scaler when `cfg` asks for float16 AMP.
    pub fn new(cfg: &TrainConfig, device: Device) -> Option<Self> {
        cfg.precision.amp.scaled().then(|| Scaler {
            scale: Tensor::full([] as [i64; 0], cfg.precision.amp.init_scale, (Kind::Float, device)),
            growth_tracker: Tensor::zeros([] as [i64; 0], (Kind::Int, device)),
            growth_interval: i64::from(cfg.precision.amp.growth_interval),
        })
    }

    /// The current scale.
    pub fn value(&self) -> f64 {
        self.scale.double_value(&[])
    }

    /// `1 / scale`, rounded as GradScaler rounds it (through float64).
    pub fn inverse(&self) -> f64 {
        self.scale.to_kind(Kind::Double).reciprocal().to_kind(Kind::Float).double_value(&[])
    }

    /// Unscales `grads` in place (undefined ones skipped); whether any held inf or NaN.
    pub fn unscale(&self, grads: &[Tensor]) -> Result<bool> {
        let inv = self.scale.to_kind(Kind::Double).reciprocal().to_kind(Kind::Float);
        let mut found = false;
        for g in grads.iter().filter(|g| g.defined()) {
            found |= g.isfinite().all().int64_value(&[]) == 0;
            tch::no_grad(|| g.shallow_clone().f_mul_(&inv).map(|_| ()))?;
        }
        Ok(found)
    }

    /// `scaler.update()` after a step that found inf/NaN or not.
    pub fn update(&mut self, found_inf: bool) -> Result<()> {
        let found = Tensor::from_slice(&[f32::from(u8::from(found_inf))]).to_device(self.scale.device());
        let _ = self.scale.f_internal_amp_update_scale_(
            &self.growth_tracker,
            &found,
            GROWTH_FACTOR,
            BACKOFF_FACTOR,
            self.growth_interval,
        )?;
        Ok(())
    }

    /// The scale and tracker, for lockstep's restart (every run restarts from the
    /// accumulation run's scaler as from its weights).
    pub fn state_tensors(&self) -> [Tensor; 2] {
        [self.scale.shallow_clone(), self.growth_tracker.shallow_clone()]
    }

    pub fn scale(&self) -> &Tensor {
        &self.scale
    }
}

/// What a micro-batch backpropagates: its loss over its divisor (`loss / K`, or the step's
/// token count), times the loss scale under a scaler (`scaler.scale(loss / K)`).
pub fn seed(loss: &Tensor, divisor: f64, scale: Option<&Tensor>) -> Tensor {
    let divided = loss / divisor;
    match scale {
        Some(s) => divided * s,
        None => divided,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{Amp, AmpConfig};

    fn scaler(init_scale: f64, growth_interval: u32) -> Scaler {
        let amp = AmpConfig { amp: Some(Amp::Float16), init_scale, growth_interval, overflow_step: None };
        let mut cfg = TrainConfig::article();
        cfg.precision.amp = amp;
        Scaler::new(&cfg, Device::Cpu).expect("float16 scales")
    }

    /// GradScaler's documented rule: inf/NaN halves the scale and restarts the count; N clean
    /// steps in a row double it.
    #[test]
    fn the_scale_backs_off_on_overflow_and_grows_after_the_interval() {
        let mut s = scaler(1024.0, 2);
        let mut seen = Vec::new();
        for found in [false, false, true, false, false, false] {
            s.update(found).unwrap();
            seen.push(s.value());
        }
        assert_eq!(seen, [1024.0, 2048.0, 1024.0, 1024.0, 2048.0, 2048.0]);
    }

    /// Unscaling by a power of two is exact, and any inf or NaN is found.
    #[test]
    fn unscaling_is_exact_and_finds_non_finite_values() {
        let s = scaler(65536.0, 2000);
        let g = Tensor::from_slice(&[3.0f32, -1.5, 1e-30]) * 65536.0;
        assert!(!s.unscale(&[g.shallow_clone(), Tensor::new()]).unwrap());
        assert_eq!(Vec::<f32>::try_from(&g).unwrap(), [3.0, -1.5, 1e-30]);
        for bad in [f32::INFINITY, f32::NAN] {
            assert!(s.unscale(&[Tensor::from_slice(&[1.0f32, bad])]).unwrap());
        }
        assert!(Scaler::new(&TrainConfig::article(), Device::Cpu).is_none());
    }
}
