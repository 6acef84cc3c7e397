//! Whether a training configuration can be planned at all: sizes, K a multiple of W, at
//! least one optimizer step, and no micro-batch that would hand train-mode BatchNorm a
//! single value per channel. Pure, so `lower.rs` refuses bad flags with it and explore
//! draws only configurations it accepts.

use crate::error::{Error, Result};
#[cfg(feature = "libtorch")]
use crate::spec::Models;
use crate::spec::{Amp, AmpConfig, DeviceKind, Dtype, TrainConfig};

/// Every check of the training flags that needs nothing but the flags.
#[cfg(feature = "libtorch")]
pub fn check_train(t: &TrainConfig) -> Result<()> {
    check_split(t)?;
    check_resnet(t)?;
    check_tiny_lm(t)?;
    check_optim(t)?;
    check_dropout(t)?;
    check_amp(t)?;
    check_bug(t)?;
    if t.run.max_steps == Some(0) {
        return Err(Error::bad_flag("--max-steps", "must be at least 1", "pass e.g. --max-steps 3, or leave it out"));
    }
    if t.model.init.is_some() && !t.model.kind.is_resnet() {
        return Err(Error::bad_flag("--init", "only the ResNets take an initial state", "drop --init or pass --model"));
    }
    if t.shape.drop_last && t.shape.data_size < t.shape.gpus {
        return Err(Error::bad_flag(
            "--drop-last",
            format!(
                "with --data-size {} below --gpus {} every rank's shard is empty (DistributedSampler drops all samples), so no optimizer step would run",
                t.shape.data_size, t.shape.gpus
            ),
            format!("drop --drop-last (torch then pads by repetition), or pass --data-size {} or more", t.shape.gpus),
        ));
    }
    let steps = super::optimizer_steps(t);
    if steps == 0 {
        return Err(Error::bad_flag(
            "--acc-steps",
            format!(
                "no optimizer step would run: each rank gets {} micro-batch(es) per epoch over {} epoch(s), fewer than K/W = {}",
                super::batches_per_rank(t),
                t.run.epochs,
                t.local_acc_steps()
            ),
            "lower --acc-steps or --batch-size, or raise --data-size or --epochs",
        ));
    }
    Ok(())
}

/// What only a ResNet needs: images and classes, and no micro-batch that would put a
/// single value per channel through train-mode BatchNorm (PyTorch raises "Expected more
/// than 1 value per channel when training").
fn check_resnet(t: &TrainConfig) -> Result<()> {
    if !t.model.kind.is_resnet() {
        return Ok(());
    }
    let r = &t.model.resnet;
    if r.image_size == 0 {
        return Err(Error::bad_flag("--image-size", "must be at least 1", "pass e.g. --image-size 32"));
    }
    if r.classes < 2 {
        return Err(Error::bad_flag("--classes", "must be at least 2", "pass e.g. --classes 10"));
    }
    // Tensor sizes are i64: a count past that would wrap (and slip past the memory check).
    if i64::try_from(r.classes).is_err() || i64::try_from(r.image_size).is_err() {
        let flag = if i64::try_from(r.classes).is_err() { "--classes" } else { "--image-size" };
        return Err(Error::bad_flag(flag, "is larger than any tensor can be", "pass a realistic size"));
    }
    let side = smallest_feature_map(r.image_size);
    let shard = super::SamplerSpec::from_train(t).num_samples();
    let smallest = match shard % t.shape.batch_size {
        0 => t.shape.batch_size.min(shard),
        short => short,
    };
    if smallest.saturating_mul(side).saturating_mul(side) == 1 {
        let why = if smallest == t.shape.batch_size {
            format!("each micro-batch holds {smallest} sample")
        } else {
            format!(
                "each rank's shard of {shard} samples ends in a micro-batch of 1 (--data-size {} over --gpus {} in batches of {})",
                t.shape.data_size, t.shape.gpus, t.shape.batch_size
            )
        };
        return Err(Error::bad_flag(
            "--batch-size",
            format!(
                "{why} and at --image-size {} the last stage is 1x1, so train-mode BatchNorm would see one value per channel",
                r.image_size
            ),
            "use micro-batches of 2 or more (change --batch-size or --data-size, or --drop-last), or a larger --image-size",
        ));
    }
    Ok(())
}

/// What only tiny-lm needs: a vocabulary, sequences with at least one target, its dtypes,
/// and a window policy its token-level loss can normalise.
fn check_tiny_lm(t: &TrainConfig) -> Result<()> {
    use crate::spec::{ModelKind, PartialWindow};
    if t.model.kind != ModelKind::TinyLm {
        return Ok(());
    }
    let lm = &t.model.lm;
    if !(2..=1 << 20).contains(&lm.vocab) {
        return Err(Error::bad_flag("--vocab", format!("{} is not in 2..=1048576", lm.vocab), "pass e.g. --vocab 64"));
    }
    if !(2..=4096).contains(&lm.seq_len) {
        return Err(Error::bad_flag(
            "--seq-len",
            format!("{} is not in 2..=4096", lm.seq_len),
            "pass e.g. --seq-len 16",
        ));
    }
    if lm.min_len < 2 || lm.min_len > lm.seq_len {
        return Err(Error::bad_flag(
            "--min-len",
            format!(
                "{} is not in 2..={} (every sequence needs a next token to predict, and fits in --seq-len)",
                lm.min_len, lm.seq_len
            ),
            format!("pass --min-len between 2 and {}", lm.seq_len),
        ));
    }
    if !matches!(t.precision.dtype, Dtype::Float32 | Dtype::Float64) {
        return Err(Error::bad_flag(
            "--dtype",
            format!("tiny-lm trains in float32 or float64, not {}", t.precision.dtype.name()),
            "pass --dtype float32 or float64",
        ));
    }
    if t.run.partial_window == PartialWindow::Carry {
        return Err(Error::bad_flag(
            "--partial-window",
            "tiny-lm divides a step's loss by the step's token count before the first backward, which a window \
             carried into the next epoch cannot know",
            "drop --partial-window carry (tiny-lm steps a short window, as LM trainers do)",
        ));
    }
    Ok(())
}

/// Dropout in [0, 1), and only where there are dropout layers.
fn check_dropout(t: &TrainConfig) -> Result<()> {
    if !(0.0..1.0).contains(&t.model.lm.dropout) {
        return Err(Error::bad_flag(
            "--dropout",
            format!("{} is not in [0, 1)", t.model.lm.dropout),
            "pass e.g. --dropout 0.1",
        ));
    }
    if t.model.lm.dropout > 0.0 && !t.model.kind.token_loss() {
        return Err(Error::bad_flag(
            "--dropout",
            "only tiny-lm has dropout layers",
            "add --model tiny-lm, or drop --dropout",
        ));
    }
    Ok(())
}

/// `--amp` over float32 weights on the CPU; the GradScaler's settings positive and only with
/// float16, the step made to overflow one that runs.
fn check_amp(t: &TrainConfig) -> Result<()> {
    let a = &t.precision.amp;
    let scaler_flag = [
        (a.init_scale != AmpConfig::default().init_scale, "--init-scale"),
        (a.growth_interval != AmpConfig::default().growth_interval, "--growth-interval"),
        (a.overflow_step.is_some(), "--overflow-step"),
    ]
    .into_iter()
    .find_map(|(given, flag)| given.then_some(flag));
    let Some(amp) = a.amp else {
        return match scaler_flag {
            Some(flag) => {
                Err(Error::bad_flag(flag, "sets the float16 loss scaler, and there is none", "add --amp float16"))
            }
            None => Ok(()),
        };
    };
    if t.precision.dtype != Dtype::Float32 {
        return Err(Error::bad_flag(
            "--amp",
            format!(
                "autocast keeps weights, gradients and optimizer state in float32, but --dtype is {}",
                t.precision.dtype.name()
            ),
            "drop --dtype (whole-model casts) or --amp (autocast)",
        ));
    }
    if t.run.device == DeviceKind::Cuda {
        return Err(Error::bad_flag(
            "--amp",
            "ddp-verify casts as torch.autocast does on the CPU; CUDA's autocast also runs softmax, layer_norm and \
             sum in float32, which is not checked against PyTorch on a GPU yet",
            "pass --device cpu with --amp",
        ));
    }
    if let (Amp::Bfloat16, Some(flag)) = (amp, scaler_flag) {
        return Err(Error::bad_flag(
            flag,
            "sets the float16 loss scaler; bfloat16 has float32's range and PyTorch scales no loss for it",
            "pass --amp float16, or drop the flag",
        ));
    }
    if !(a.init_scale.is_finite() && a.init_scale > 0.0) {
        return Err(Error::bad_flag(
            "--init-scale",
            format!("{} is not a positive number", a.init_scale),
            "pass e.g. --init-scale 65536",
        ));
    }
    if a.growth_interval == 0 {
        return Err(Error::bad_flag("--growth-interval", "must be at least 1", "pass e.g. --growth-interval 2000"));
    }
    let steps = super::optimizer_steps(t);
    if let Some(s) = a.overflow_step.filter(|&s| s >= steps) {
        return Err(Error::bad_flag(
            "--overflow-step",
            format!("step {s} never runs: the runs make {steps} optimizer steps, counted from 0"),
            format!("pass a step below {steps}"),
        ));
    }
    Ok(())
}

/// AdamW's betas in [0, 1), ε and the clipping norm positive and finite.
pub fn check_optim(t: &TrainConfig) -> Result<()> {
    let o = &t.optim;
    let (b1, b2) = o.betas;
    if ![b1, b2].iter().all(|b| (0.0..1.0).contains(b)) {
        return Err(Error::bad_flag(
            "--betas",
            format!("{b1} {b2} are not both in [0, 1)"),
            "pass e.g. --betas 0.9 0.999",
        ));
    }
    let positive = |v: f64| v.is_finite() && v > 0.0;
    if !positive(o.eps) {
        return Err(Error::bad_flag(
            "--eps",
            format!("{} is not a finite positive number", o.eps),
            "pass e.g. --eps 1e-8",
        ));
    }
    if let Some(x) = o.clip_grad_norm.filter(|&x| !positive(x)) {
        return Err(Error::bad_flag(
            "--clip-grad-norm",
            format!("{x} is not a finite positive norm"),
            "pass e.g. --clip-grad-norm 1.0, or leave it out to clip nothing",
        ));
    }
    Ok(())
}

/// A planted bug the configuration can carry: a model that has what the bug misdoes, and
/// what it misuses (`plan::bugs::need`).
#[cfg(feature = "libtorch")]
fn check_bug(t: &TrainConfig) -> Result<()> {
    let Some(b) = t.inject else { return Ok(()) };
    if let Some(need) = super::bugs::need(b).filter(|n| !(n.has)(t)) {
        return Err(Error::bad_flag("--inject", format!("{} {}", b.name(), need.why), need.fix));
    }
    if b.applies_to(t.model.kind) {
        return Ok(());
    }
    let (why, fix) = match b.models() {
        Models::TokenLoss => ("is a bug of the token-level loss, which only tiny-lm has", "add --model tiny-lm"),
        Models::Dropout => ("misdraws dropout masks, and only tiny-lm has dropout", "add --model tiny-lm --dropout P"),
        Models::BigBatch => (
            "is made alike by both runs, which only the big batch shows, and ResNets have none",
            "inject it with --model linear or tiny-lm",
        ),
        Models::DividedByK | Models::All => (
            "divides by K, but tiny-lm divides by the step's token count",
            "inject mean-per-micro-batch, count-per-rank or count-before-shift for tiny-lm's scaling mistakes",
        ),
    };
    Err(Error::bad_flag("--inject", format!("{} {why}", b.name()), fix))
}

/// The checks a sampling plan needs: sizes, and K a multiple of W.
pub fn check_split(t: &TrainConfig) -> Result<()> {
    let positive = |flag: &'static str, v: usize| {
        if v == 0 {
            Err(Error::bad_flag(flag, "must be at least 1", format!("pass {flag} 1 or more")))
        } else {
            Ok(())
        }
    };
    positive("--gpus", t.shape.gpus)?;
    positive("--acc-steps", t.shape.acc_steps)?;
    positive("--batch-size", t.shape.batch_size)?;
    positive("--epochs", t.run.epochs)?;
    positive("--data-size", t.shape.data_size)?;
    positive("--features", t.model.linear.features)?;
    if !t.shape.acc_steps.is_multiple_of(t.shape.gpus) {
        let lo = (t.shape.acc_steps / t.shape.gpus).max(1).saturating_mul(t.shape.gpus);
        return Err(Error::bad_flag(
            "--acc-steps",
            format!(
                "{} is not a multiple of --gpus {} (each rank accumulates K/W micro-batches)",
                t.shape.acc_steps, t.shape.gpus
            ),
            format!("use --acc-steps {lo} or {}", lo.saturating_add(t.shape.gpus)),
        ));
    }
    // N < W is fine, as in torch: DistributedSampler pads by repeating the indices (or,
    // with drop_last, leaves every shard empty, which `validate` refuses as no step).
    for (flag, v) in [("--lr", t.optim.lr), ("--momentum", t.optim.momentum), ("--weight-decay", t.optim.weight_decay)]
    {
        if !v.is_finite() || v < 0.0 {
            return Err(Error::bad_flag(flag, format!("{v} is not a finite non-negative number"), "pass e.g. 0.01"));
        }
    }
    Ok(())
}

/// Side of the last stage's feature map for S x S inputs: the 7x7 stride-2 stem, the
/// stride-2 max-pool and three stride-2 stages each map s to floor((s - 1) / 2) + 1.
pub fn smallest_feature_map(image_size: usize) -> usize {
    (0..5).fold(image_size, |s, _| (s.max(1) - 1) / 2 + 1)
}
