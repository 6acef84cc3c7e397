//! Whether this machine's kernels repeat themselves: the first micro-batch's forward and
//! backward, computed twice from the same weights, must give the same bits. Everything the
//! tool proves rests on that: a kernel that returns other bits for the same input (oneDNN's
//! AMX bfloat16 convolution backward in torch 2.13 returns values like 2e26 or NaN on a
//! Sapphire Rapids CPU) makes any difference between two runs meaningless, so such a
//! machine gets no verdict (exit 4) instead of a false "not equivalent".

use super::host::snapshot;
use super::{Derives, Run};
use crate::error::Result;
use crate::evidence::{Params, Unrepeatable, Values};
use crate::plan::RunPlan;
use crate::spec::{DeviceKind, KernelMode, Platform, TrainConfig};

/// Test hook: set, the second computation's first gradient comes out NaN, as from a kernel
/// that does not repeat itself (this machine's kernels do repeat).
pub const UNREPEATABLE_HOOK: &str = "DDP_VERIFY_TEST_UNREPEATABLE";

/// Runs `cfg`'s first micro-batch twice from the initial weights (its bug left out: the
/// kernels are on trial, not the loop); `None` when both gave the same bits. Costs two
/// micro-batches of the accumulation run, on its device.
pub fn repeat_check(cfg: &TrainConfig, platform: &Platform) -> Result<Option<Unrepeatable>> {
    let clean = TrainConfig { inject: None, ..cfg.clone() };
    let mut run = Run::new(&clean, RunPlan::accumulation(&clean), None, Derives::Nothing)?;
    let Some(first) = run.plan.steps.first().and_then(|g| g.first()).cloned() else { return Ok(None) };
    let group = [first];
    let divisors = run.divisors(0, &group, false)?;
    let epoch = run.plan.epochs.first().copied().unwrap_or(0);
    let mut twice = Vec::new();
    for _ in 0..2 {
        run.opt.zero_grad()?;
        run.forward_backward(&group, &divisors, epoch, None)?;
        twice.push(snapshot(run.model.parameters().iter().map(|(n, p)| (n, p.grad()))));
    }
    if std::env::var_os(UNREPEATABLE_HOOK).is_some() {
        if let Some((_, g)) = twice[1].first_mut() {
            *g = Values::from_f64_as(g.elem(), g.shape(), vec![f64::NAN; g.numel()]);
        }
    }
    Ok(differences(&twice[0], &twice[1]).map(|(tensor, jump, differing)| Unrepeatable {
        dtype: match cfg.precision.amp.amp {
            Some(amp) => format!("{} under --amp {}", cfg.precision.dtype.name(), amp.name()),
            None => cfg.precision.dtype.name().to_string(),
        },
        tensor,
        jump,
        differing,
        gradients: twice[0].len(),
        platform: platform.describe(),
        fix: fix(cfg.run.device, platform.kernels.mode),
    }))
}

/// The flag that avoids it, or where to look when nothing here does.
fn fix(device: DeviceKind, mode: KernelMode) -> String {
    match (device, mode) {
        (DeviceKind::Cuda, _) => "run with --device cpu, whose portable kernels repeat".into(),
        (DeviceKind::Cpu, KernelMode::Native) => {
            "pass --kernels portable (oneDNN off, ATen's AVX2 kernels, MKL's COMPATIBLE path), which repeat on every \
             x86-64 CPU"
                .into()
        }
        (DeviceKind::Cpu, KernelMode::Portable) => {
            "the portable kernels should repeat everywhere: run `ddp-verify devices` and report what it prints".into()
        }
    }
}

/// Where two snapshots of the same gradients differ in any bit: the tensor with the
/// largest jump, that jump, and how many tensors differ.
pub fn differences(a: &Params, b: &Params) -> Option<(String, f64, usize)> {
    let mut worst: Option<(String, f64)> = None;
    let mut differing = 0;
    for ((name, x), (_, y)) in a.iter().zip(b) {
        if same_bits(x, y) {
            continue;
        }
        differing += 1;
        // NaN (one side NaN, or both infinite alike) counts as an infinite jump.
        let jump = x.to_f64().iter().zip(y.to_f64()).fold(0.0f64, |m, (p, q)| {
            let d = (p - q).abs();
            m.max(if d.is_nan() { f64::INFINITY } else { d })
        });
        if worst.as_ref().is_none_or(|(_, w)| jump > *w) {
            worst = Some((name.clone(), jump));
        }
    }
    worst.map(|(name, jump)| (name, jump, differing))
}

/// Bit for bit, NaN payloads and signed zeros included.
fn same_bits(x: &Values, y: &Values) -> bool {
    x.shape() == y.shape() && x.elem() == y.elem() && x.le_bytes() == y.le_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(values: &[&[f32]]) -> Params {
        values.iter().enumerate().map(|(i, v)| (format!("p{i}"), Values::f32s(v.to_vec()))).collect()
    }

    #[test]
    fn the_same_bits_are_no_difference() {
        let a = params(&[&[1.0, f32::NAN], &[0.5]]);
        assert_eq!(differences(&a, &params(&[&[1.0, f32::NAN], &[0.5]])), None);
    }

    #[test]
    fn the_largest_jump_is_named_and_nan_is_infinite() {
        let a = params(&[&[1.0, 2.0], &[0.5], &[3.0]]);
        let b = params(&[&[1.0, 2.5], &[f32::NAN], &[3.0]]);
        assert_eq!(differences(&a, &b), Some(("p1".to_string(), f64::INFINITY, 2)));
        let c = params(&[&[1.0, 2.0], &[0.5], &[3.0 + 2.0f32.powi(-22)]]);
        assert_eq!(differences(&a, &c), Some(("p2".to_string(), 2f64.powi(-22), 1)));
    }

    /// -0.0 == 0.0 numerically, but the bits differ: a kernel that flips a sign does not repeat.
    #[test]
    fn a_flipped_zero_is_a_difference() {
        let a = params(&[&[0.0]]);
        let b = params(&[&[-0.0]]);
        assert_eq!(differences(&a, &b).map(|d| d.2), Some(1));
    }
}
