//! Lowering the commands that train our own models (the main job, `suite`, `explore`,
//! `devices`' kernels): they run with libtorch, so they are built with it.

use std::path::Path;

use ddp_verify_cli::values::Pick;
use ddp_verify_cli::{defaults, parse_case, AmpArgs, ExploreArgs, KernelArgs, OptimArgs, RunArgs, SuiteArgs};

use super::{check_tolerance, checked_overrides, overrides, reports, shape};
use crate::dist::{device, world};
use crate::error::{Error, Result};
use crate::evidence::golden;
use crate::plan;
use crate::spec::{
    AmpConfig, Bug, Config, ExploreOptions, KernelMode, LinearConfig, LmConfig, ModelConfig, ModelKind, OptimConfig,
    PartialWindow, Precision, ResnetConfig, RunShape, Suite, SuiteCase, TrainConfig,
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

/// `--kernels`, else the mode `golden`'s header records (read before libtorch makes any
/// tensor, which fixes the kernels for the process), else portable. A golden that cannot
/// be read here is refused later, by the run that loads it.
pub fn kernel_mode(args: &KernelArgs, golden: Option<&Path>) -> Result<KernelMode> {
    let asked = args.kernels;
    let vendor = || crate::dist::kernels::machine(crate::spec::DeviceKind::Cpu).vendor;
    let made = golden.and_then(|dir| golden::read_meta(&golden::for_vendor(dir, &vendor()).ok()?).ok());
    let made = made.and_then(|m| m.kernels).map(|k| k.mode);
    match (asked, made) {
        (Some(a), Some(m)) if a != m => Err(Error::bad_flag(
            "--kernels",
            format!("the golden was made with {} kernels, this run asks for {}", m.name(), a.name()),
            format!(
                "drop --kernels to compute as the golden was made, or remake the golden with --kernels {} --bless",
                a.name()
            ),
        )),
        (a, m) => Ok(a.or(m).unwrap_or_default()),
    }
}

/// Keys a suite case may not set: the suite writes one report for all cases, and only checks.
const SUITE_OWNS: [(&str, &str); 5] = [
    ("report", "the suite writes one report for every case: pass --report to ddp-verify suite"),
    ("report-file", "the suite writes one report for every case: pass --report-file to ddp-verify suite"),
    ("plot", "a suite draws no plots: rerun the case alone with --plot"),
    ("bless", "a suite only checks: bless with a single run"),
    ("timeout", "the suite has one deadline for all its cases: pass --timeout to ddp-verify suite"),
];

/// `suite FILE.toml`: every case read, lowered like the command line and preflighted, so
/// an invalid case stops the suite before any rank starts, naming the case and the key.
pub fn suite(args: &SuiteArgs) -> Result<Suite> {
    let file = &args.file;
    let mut cases: Vec<SuiteCase> = Vec::new();
    for (name, table) in super::suite_file::suite_tables(file)? {
        let refuse = |key: &str, problem: String, fix: String| {
            Error::bad_file(file, format!("case '{name}', key {key}: {problem}"), fix)
        };
        let mut keys = Vec::new();
        for (key, value) in table.iter().filter(|(k, _)| *k != "name") {
            if key == "command" || key == "fills" {
                let problem =
                    "belongs to a case of your own script; this suite's other cases train ddp-verify's models";
                return Err(refuse(key, problem.into(), "put your scripts' cases in a suite file of their own".into()));
            }
            if let Some((_, why)) = SUITE_OWNS.iter().find(|(k, _)| k == key) {
                return Err(refuse(key, "not allowed in a suite".into(), why.to_string()));
            }
            keys.push((key.clone(), super::suite_file::case_value(value).map_err(|p| refuse(key, p.0, p.1))?));
        }
        let mut run = parse_case(&keys).map_err(|e| {
            let key = e.key.unwrap_or_else(|| "-".into());
            refuse(&key, e.problem, "see ddp-verify --help for the flag's values".into())
        })?;
        // The suite's --kernels is every case's, unless the case names its own.
        run.kernels.kernels = run.kernels.kernels.or(args.kernels.kernels);
        let config = verification(&run).map_err(|e| super::suite_file::in_case(file, &name, e))?;
        cases.push(SuiteCase { name, config });
    }
    // One process computes every case: one kernel mode, pinned before any case's preflight
    // reads a tensor.
    let mode = match args.kernels.kernels {
        Some(k) => k,
        None => cases.first().map(|c| c.config.kernels).unwrap_or_default(),
    };
    if let Some(c) = cases.iter().find(|c| c.config.kernels != mode) {
        return Err(Error::bad_file(
            file,
            format!(
                "case '{}' computes with {} kernels, the suite with {}",
                c.name,
                c.config.kernels.name(),
                mode.name()
            ),
            "give every case the same kernels (their goldens' mode), or run them as separate suites",
        ));
    }
    let device = cases.first().map(|c| c.config.train.run.device).unwrap_or_default();
    crate::dist::kernels::apply(mode, device)?;
    for case in &cases {
        crate::jobs::preflight(&case.config).map_err(|e| super::suite_file::in_case(file, &case.name, e))?;
    }
    let reports = reports(&args.reports)?;
    crate::report::check_targets(&reports, None, args.force)?;
    Ok(Suite { file: file.clone(), cases, reports, timeout_s: args.timeout, progress: world::progress_wanted() })
}

/// `explore`'s flags. Every check happens here, before any rank starts.
pub fn explore(args: &ExploreArgs) -> Result<ExploreOptions> {
    let cases = args.cases.unwrap_or(defaults::EXPLORE_CASES);
    if cases == 0 {
        return Err(Error::bad_flag("--cases", "must be at least 1", "pass e.g. --cases 100"));
    }
    if let Some(flag) = super::script_only_explore_flag(args) {
        return Err(Error::bad_flag(
            flag,
            "is for exploring your own command",
            "give your training command after -- (explore ... -- python train.py ARGS), or drop it",
        ));
    }
    if args.max_gpus == 0 {
        return Err(Error::bad_flag("--max-gpus", "must be at least 1", "pass e.g. --max-gpus 3"));
    }
    let bugs = match args.inject {
        None => vec![None],
        Some(Pick::All) => Bug::ALL.into_iter().map(Some).collect(),
        Some(Pick::One(bug)) => vec![Some(bug)],
    };
    // Read and writable before any rank starts: a finding must not be lost at the end.
    crate::jobs::explore::read_regressions(Some(&args.regressions))?;
    crate::outputs::check_dir(
        "--regressions",
        args.regressions.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new(".")),
        true,
    )?;
    if args.regressions.is_dir() {
        return Err(Error::bad_file(
            &args.regressions,
            "--regressions names a directory, not a file",
            "pass a file path",
        ));
    }
    let tolerance = checked_overrides(&args.tolerance)?;
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos() as u64)
    });
    let drawn = [ModelKind::Linear, ModelKind::ResnetTiny, ModelKind::TinyLm];
    let models = match args.model {
        Pick::All => drawn.to_vec(),
        Pick::One(m) if drawn.contains(&m) => vec![m],
        Pick::One(other) => {
            return Err(Error::bad_flag(
                "--model",
                format!("explore draws linear, resnet-tiny or tiny-lm configurations, not '{other}'"),
                "pass --model linear, resnet-tiny, tiny-lm or all",
            ))
        }
    };
    // `--inject all` passes over each bug on the models that can carry it; one named must fit.
    let named = args.inject != Some(Pick::All);
    if let Some(b) = bugs.iter().flatten().find(|b| named && !models.iter().any(|&m| b.applies_to(m))) {
        return Err(Error::bad_flag(
            "--inject",
            format!("{} applies to none of the models drawn ({})", b.name(), args.model),
            "pass --model tiny-lm for the token-count bugs, linear or resnet-tiny for no-loss-scale and double-scale",
        ));
    }
    Ok(ExploreOptions {
        models,
        cases,
        max_gpus: args.max_gpus,
        seed,
        bugs,
        tolerance,
        regressions: Some(args.regressions.clone()),
        progress: world::progress_wanted(),
        json: args.json,
        kernels: kernel_mode(&args.kernels, None)?,
    })
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
