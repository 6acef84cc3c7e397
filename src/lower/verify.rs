//! The main command's flags for our own models: a verification's [`Config`], built with
//! libtorch (the device is resolved here).

use ddp_verify_cli::{defaults, AmpArgs, OptimArgs, RunArgs};

use super::{check_tolerance, kernel_mode, overrides, reports, shape};
use crate::dist::{device, world};
use crate::error::{Error, Result};
use crate::plan;
use crate::spec::{
    AmpConfig, Config, LinearConfig, LmConfig, ModelConfig, OptimConfig, PartialWindow, Precision, ResnetConfig,
    RunShape, TrainConfig,
};

/// The main command's flags as a [`Config`], the device chosen, every flag checked.
pub fn verification(args: &RunArgs) -> Result<Config> {
    let reports = reports(&args.reports)?;
    if args.sample.is_some() {
        return Err(Error::bad_flag(
            "--sample",
            "samples what a script's legs record; ddp-verify's own runs are compared whole",
            "drop --sample, or give your training command after -- (-- python train.py ARGS)",
        ));
    }
    if args.node_rank.is_some() {
        return Err(Error::bad_flag(
            "--node-rank",
            "places a script's DDP leg among several nodes; ddp-verify's own runs start their ranks here",
            "drop --node-rank, or give your torchrun --nnodes command after --",
        ));
    }
    let n = &args.net;
    if n.sync_bn {
        return Err(Error::bad_flag(
            "--sync-bn",
            "SyncBatchNorm is never equivalent to accumulation: it normalises over all W ranks' micro-batches \
             at once, accumulation over each micro-batch of --batch-size alone (and PyTorch's SyncBatchNorm \
             refuses CPU tensors)",
            "drop --sync-bn; plain BatchNorm with DDP is what accumulation reproduces",
        ));
    }
    let shape = shape(&args.shape);
    let model = ModelConfig {
        kind: n.model,
        init: n.init.clone(),
        linear: LinearConfig { features: args.features.unwrap_or(shape.data_size) },
        resnet: ResnetConfig { image_size: n.image_size, classes: n.classes },
        lm: LmConfig { vocab: n.vocab, seq_len: n.seq_len, min_len: n.min_len, dropout: n.dropout },
    };
    let optim = optim(&args.optim)?;
    // Our own launcher puts all W ranks on this machine; a user's mpirun says how many.
    let local_ranks = if world::inside_mpi_world() { device::local_size().unwrap_or(1) } else { shape.gpus };
    let device = device::resolve(n.device, local_ranks)?;
    let run = RunShape {
        epochs: args.epochs,
        max_steps: n.max_steps,
        // Deep nets carry rounding from step to step: lockstep unless asked otherwise.
        lockstep: n.lockstep || (n.model.is_deep() && !n.free_running),
        partial_window: n.partial_window.unwrap_or(PartialWindow::default_for(n.model)),
        big_batch: !n.no_big_batch,
        device: device.kind,
        shared_gpus: device.shared_gpus,
    };
    let precision = Precision { dtype: n.dtype, amp: amp(&args.amp) };
    let train = TrainConfig { shape, model, optim, precision, run, inject: args.inject };
    let overrides = overrides(&args.tolerance);
    let cfg = Config {
        tolerance: overrides.tolerance(train.precision.dtype, train.run.lockstep),
        derive_bounds: overrides.derive(&train),
        train,
        save_trace: args.save_trace.clone(),
        golden: args.golden.clone(),
        force: args.force,
        bless: args.bless,
        reports,
        timeout_s: args.timeout,
        plot: args.plot.clone(),
        strict_buffers: n.strict_buffers,
        device_note: device.note,
        kernels: kernel_mode(&args.kernels, args.golden.as_deref().filter(|_| !args.bless))?,
    };
    if n.big_batch && cfg.train.precision.amp.amp.is_some() {
        return Err(Error::bad_flag(
            "--big-batch",
            "under --amp the big batch rounds its matrix products to the autocast dtype over K·B samples at \
             once, where accumulation rounds each micro-batch's: no bound follows that, so it is not made",
            "drop --big-batch; accumulation vs DDP is the comparison under --amp",
        ));
    }
    if n.big_batch && !n.model.has_big_batch() {
        return Err(Error::bad_flag(
            "--big-batch",
            "a ResNet's BatchNorm normalises each micro-batch by its own statistics, so one batch of K·B \
             samples is a different computation, not a reference for accumulation",
            "drop --big-batch; accumulation vs DDP is the comparison for ResNets",
        ));
    }
    plan::checks::check_train(&cfg.train)?;
    check_tolerance(&cfg.tolerance)?;
    Ok(cfg)
}

/// `--lr`, `--momentum`, `--weight-decay`, `--optimizer`, `--betas`, `--eps`,
/// `--clip-grad-norm`, `--lr-schedule` (their ranges are `plan::checks`').
fn optim(o: &OptimArgs) -> Result<OptimConfig> {
    let betas = match o.betas.as_deref() {
        None => defaults::BETAS,
        Some(&[b1, b2]) => (b1, b2),
        Some(_) => return Err(Error::bad_flag("--betas", "takes two numbers", "pass e.g. --betas 0.9 0.999")),
    };
    Ok(OptimConfig {
        lr: o.lr,
        momentum: o.momentum,
        weight_decay: o.weight_decay,
        optimizer: o.optimizer,
        betas,
        eps: o.eps,
        clip_grad_norm: o.clip_grad_norm,
        lr_schedule: o.lr_schedule,
    })
}

/// `--amp`, `--init-scale`, `--growth-interval`, `--overflow-step` (their ranges and what
/// they need are `plan::checks`').
fn amp(a: &AmpArgs) -> AmpConfig {
    AmpConfig {
        amp: a.amp,
        init_scale: a.init_scale,
        growth_interval: a.growth_interval,
        overflow_step: a.overflow_step,
    }
}
