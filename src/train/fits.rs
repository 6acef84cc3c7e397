//! Whether a configuration fits this machine's memory, checked before any rank starts.
//! The machine is probed through a closure ([`available_bytes`] on a real one), so the rule
//! is tested on made-up machines.

use crate::error::{Error, Result};
pub use crate::plan::memory::{available_bytes, check_split_fits};
use crate::plan::memory::{gib, too_much};
use crate::spec::{Dtype, TchKind, TrainConfig};

/// What each rank process costs before any data or model: libtorch and Open MPI (measured
/// about 110 MiB).
const RANK_BASELINE_BYTES: f64 = 110.0 * MIB;
/// Copies of the parameters a run holds: weights, gradients, momentum, peaks, and the
/// derived bound's buffers (`train::Bounds`), with room for libtorch's temporaries.
const PARAMETER_COPIES: f64 = 10.0;
const MIB: f64 = (1u64 << 20) as f64;

/// Refuses, before any rank starts, what this machine cannot hold, rather than fail in
/// libtorch's allocator or ask the kernel for W processes it has no room for: W ranks,
/// each holding the whole data set, the sampler's index lists and the model, plus the
/// accumulation run on rank 0 (with the bound's W partial sums). Names the flag whose
/// part is largest, with the figures. `available` probes the machine's free memory in bytes
/// ([`available_bytes`] on a real one), so the rule is tested on made-up machines.
pub fn check_fits(cfg: &TrainConfig, available: impl FnOnce() -> Option<f64>) -> Result<()> {
    let row = match cfg.model.kind {
        m if m.is_resnet() => 3.0 * (cfg.model.resnet.image_size as f64).powi(2),
        // ids and labels, int64, counted as two float32 rows each.
        m if m.token_loss() => 4.0 * cfg.model.lm.seq_len as f64,
        _ => cfg.model.linear.features as f64,
    };
    // Drawn in float32, then cast: both copies live at once.
    let width = if cfg.precision.dtype == Dtype::Float32 {
        4.0
    } else {
        4.0 + cfg.precision.dtype.kind().elt_size_in_bytes() as f64
    };
    let n = cfg.shape.data_size as f64;
    let (w, runs) = (cfg.shape.gpus as f64, (cfg.shape.gpus + 1) as f64);
    let data = n * row * width + n * 8.0 * 4.0;
    let params = crate::train::models::parameter_count(cfg) * cfg.precision.dtype.kind().elt_size_in_bytes() as f64;
    let parts = [
        ("--gpus", w * RANK_BASELINE_BYTES),
        ("--data-size", runs * data),
        (parameter_flag(cfg), (runs * PARAMETER_COPIES + w) * params),
        ("--batch-size", activation_bytes(cfg)),
    ];
    let total: f64 = parts.iter().map(|(_, b)| b).sum();
    let Some(available) = too_much(total, available) else { return Ok(()) };
    let (flag, _) = parts.iter().copied().fold(("--gpus", 0.0), |a, b| if b.1 > a.1 { b } else { a });
    let (problem, fix) = match flag {
        "--gpus" => (
            format!("{} ranks need about {:.1} GiB before any data (110 MiB each)", cfg.shape.gpus, gib(parts[0].1)),
            "use fewer --gpus",
        ),
        "--batch-size" => (
            format!(
                "one forward and backward of {} sequences of {} tokens over a vocabulary of {} holds about {:.1} GiB of \
                 activations (logits and attention), in every process and in the big batch of K·B",
                cfg.shape.batch_size,
                cfg.model.lm.seq_len,
                cfg.model.lm.vocab,
                gib(parts[3].1)
            ),
            "use a smaller --batch-size, --seq-len or --vocab",
        ),
        "--data-size" => (
            format!(
                "{} samples of {} values is {:.1} GiB of data in each of {} processes",
                cfg.shape.data_size,
                row,
                gib(data),
                cfg.shape.gpus + 1
            ),
            "use a smaller --data-size (or --features, --image-size)",
        ),
        _ => (
            format!(
                "the model's {:.3e} parameters take about {:.1} GiB over the {} runs",
                crate::train::models::parameter_count(cfg),
                gib(parts[2].1),
                cfg.shape.gpus + 1
            ),
            match parameter_flag(cfg) {
                "--classes" => "use fewer --classes",
                "--vocab" => "use a smaller --vocab (or --seq-len)",
                _ => "use fewer --features",
            },
        ),
    };
    Err(Error::bad_flag(
        flag,
        format!("{problem}: about {:.1} GiB in all, but only {:.1} GiB is available", gib(total), gib(available)),
        fix,
    ))
}

/// tiny-lm's activations at their largest: each rank's micro-batch of B sequences, and on
/// rank 0 also accumulation's and the big batch's K·B (logits and their gradient at V per
/// position, attention scores at T per position and head, the residual stream's copies).
/// The other models' activations are small beside their data and parameters.
fn activation_bytes(cfg: &TrainConfig) -> f64 {
    use super::models::tiny_lm::{D_MODEL, HEADS, LAYERS, MLP};
    if !cfg.model.kind.token_loss() {
        return 0.0;
    }
    let rows = ((cfg.shape.gpus + 1) * cfg.shape.batch_size + cfg.shape.acc_steps * cfg.shape.batch_size) as f64
        * cfg.model.lm.seq_len as f64;
    let per_position = 4.0 * cfg.model.lm.vocab as f64
        + LAYERS as f64 * (4.0 * HEADS as f64 * cfg.model.lm.seq_len as f64 + 16.0 * D_MODEL as f64 + 4.0 * MLP as f64);
    rows * per_position * cfg.precision.dtype.kind().elt_size_in_bytes() as f64
}

/// The flag that sizes the model most.
fn parameter_flag(cfg: &TrainConfig) -> &'static str {
    match cfg.model.kind {
        m if m.is_resnet() => "--classes",
        m if m.token_loss() => "--vocab",
        _ => "--features",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{ModelKind, Shape};

    const GIB: f64 = (1u64 << 30) as f64;

    fn machine(gib: f64) -> impl FnOnce() -> Option<f64> {
        move || Some(gib * GIB)
    }

    /// The linear model on N samples of D features.
    fn linear(data_size: usize, features: usize) -> TrainConfig {
        let mut t = TrainConfig::article();
        (t.shape.data_size, t.model.linear.features) = (data_size, features);
        t
    }

    #[test]
    fn what_fits_passes_and_an_unknown_machine_refuses_nothing() {
        let cfg = TrainConfig::article();
        assert!(check_fits(&cfg, machine(1.0)).is_ok());
        let huge = linear(1 << 30, 1 << 10);
        assert!(check_fits(&huge, || None).is_ok());
    }

    /// The flag whose part is largest is named, with the figures.
    #[test]
    fn the_largest_part_is_named_on_a_small_machine() {
        let mut many = TrainConfig::article();
        many.shape = Shape { gpus: 64, acc_steps: 64, data_size: 64, ..many.shape };
        let e = check_fits(&many, machine(4.0)).unwrap_err().to_string();
        assert!(e.starts_with("--gpus: 64 ranks need about") && e.contains("only 4.0 GiB is available"), "{e}");
        let data = linear(1 << 24, 1 << 8);
        let e = check_fits(&data, machine(4.0)).unwrap_err().to_string();
        assert!(e.starts_with("--data-size: "), "{e}");
        let mut lm = TrainConfig::article();
        (lm.model.kind, lm.model.lm.vocab) = (ModelKind::TinyLm, 1 << 20);
        let e = check_fits(&lm, machine(4.0)).unwrap_err().to_string();
        assert!(e.starts_with("--vocab: ") || e.starts_with("--batch-size: "), "{e}");
    }
}
