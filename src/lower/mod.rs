//! Flags → one validated configuration. Values' names and `--timeout` are checked while
//! parsing (`crates/cli`); every other check of the input happens here, once:
//! [`verification`], [`split`] and [`explore`] check what needs nothing but the flags (every
//! rank may run them: they fail alike everywhere); [`crate::jobs::preflight`] checks what depends on the
//! machine (files, memory, the CI variable) and runs in one process only, before any
//! training. The stages below receive plain, valid data. Our own models' commands are in
//! `own.rs`, built with libtorch; the rest is in every build.

use ddp_verify_cli::{CompareArgs, ReportArgs, RunArgs, SplitArgs, SplitShape, ToleranceArgs};

use crate::error::{Error, Result};
use crate::evidence::SAVED_FILES;
use crate::plan;
use crate::spec::{
    CompareOptions, Dtype, Format, ReportTarget, ScriptOptions, Shape, Tolerance, ToleranceOverrides, TrainConfig,
};

mod explore_script;
#[cfg(feature = "libtorch")]
mod own;
mod suite_file;

pub use explore_script::{explore_script, script_only_explore_flag};
#[cfg(feature = "libtorch")]
pub use own::{explore, kernel_mode, suite, verification};
pub use suite_file::{is_script_suite, script_suite};

/// `--report FORMAT [--report-file PATH]...`, paired by position; the table on stdout by default.
pub fn reports(args: &ReportArgs) -> Result<Vec<ReportTarget>> {
    if args.report_file.len() > args.report.len().max(1) {
        return Err(Error::bad_flag(
            "--report-file",
            format!("{} files for {} --report formats", args.report_file.len(), args.report.len()),
            "give one --report FORMAT for each --report-file, in the same order",
        ));
    }
    let formats = match args.report.is_empty() {
        true => vec![Format::Table],
        false => args.report.clone(),
    };
    Ok(formats
        .iter()
        .enumerate()
        .map(|(i, &format)| ReportTarget { format, path: args.report_file.get(i).cloned() })
        .collect())
}

/// `compare`'s flags: the two trace files (a directory stands for the pair `--save-trace`
/// writes), the tolerance and the reports, checked before either file is read.
pub fn compare(args: &CompareArgs) -> Result<CompareOptions> {
    let paths = match (&args.a, &args.b) {
        (dir, None) if dir.is_dir() => [dir.join(SAVED_FILES[0]), dir.join(SAVED_FILES[1])],
        (file, None) => {
            return Err(Error::bad_file(
                file,
                format!("compare needs two traces, or one directory holding {} and {}", SAVED_FILES[0], SAVED_FILES[1]),
                "give the DDP trace as a second argument",
            ))
        }
        (a, Some(b)) => [a.clone(), b.clone()],
    };
    for p in &paths {
        if !p.is_file() {
            let what = crate::error::what_is(p);
            return Err(Error::bad_file(p, format!("trace {what}"), "pass a .safetensors trace file"));
        }
    }
    if std::fs::canonicalize(&paths[0]).ok() == std::fs::canonicalize(&paths[1]).ok() {
        return Err(Error::bad_file(&paths[1], "is the same file as A", "compare two different runs' traces"));
    }
    if let Some(big) = &args.big_batch {
        if !big.is_file() {
            return Err(Error::bad_file(
                big,
                format!("trace {}", crate::error::what_is(big)),
                "pass --big-batch FILE.safetensors",
            ));
        }
    }
    let tolerance = checked_overrides(&args.tolerance)?;
    let reports = reports(&args.reports)?;
    crate::report::check_targets(&reports, args.plot.as_ref(), args.force)?;
    Ok(CompareOptions {
        paths,
        big: args.big_batch.clone(),
        tolerance,
        reports,
        plot: args.plot.clone(),
        strict_buffers: args.strict_buffers,
    })
}

/// `-- python train.py ARGS`: the user's script as both legs. K a multiple of W ≥ 2, a
/// Python command or a launcher (torchrun, accelerate launch; torchrun's DDP leg maybe over
/// several nodes, this one's rank known), and an output directory whose traces are not
/// overwritten without --force.
pub fn script(args: &RunArgs) -> Result<ScriptOptions> {
    let (k, w) = (args.shape.acc_steps, args.shape.gpus);
    if w < 2 {
        return Err(Error::bad_flag("--gpus", "a DDP leg of one process proves nothing", "give --gpus 2 or more"));
    }
    if k == 0 || k % w != 0 {
        return Err(Error::bad_flag(
            "--acc-steps",
            format!("K={k} is not a multiple of --gpus {w}: each DDP rank accumulates K/W micro-batches"),
            "give a multiple of --gpus",
        ));
    }
    let launcher = crate::jobs::launcher::parse(&args.script).map_err(|problem| {
        Error::bad_flag(
            "--",
            problem,
            "give -- python train.py ARGS, -- torchrun [OPTIONS] train.py ARGS or -- accelerate launch [OPTIONS] train.py ARGS",
        )
    })?;
    let node_rank = node_rank(args.node_rank, &launcher, w)?;
    let out = match &args.save_trace {
        Some(dir) => {
            // Writable (or creatable) before any leg runs: bad output is exit 2, not a failed run.
            crate::outputs::check_dir("--save-trace", dir, true)?;
            let files = SAVED_FILES.iter().copied().chain([crate::jobs::script::BIG_BATCH_FILE]);
            let taken: Vec<_> = files.map(|f| dir.join(f)).filter(|p| p.exists()).collect();
            // Another node writes no trace (node 0's rank 0 writes them into the shared DIR).
            if let (Some(p), false, 0) = (taken.first(), args.force, node_rank) {
                return Err(Error::bad_file(p, "exists", "pass --force to replace it, or choose another --save-trace"));
            }
            dir.clone()
        }
        None => tempfile::Builder::new()
            .prefix("ddp-verify-script-")
            .tempdir()
            .map_err(|e| Error::io("creating a directory for the legs' traces", e))?
            .keep(),
    };
    if args.shape.batch_size.checked_mul(k).is_none() {
        return Err(Error::bad_flag("--batch-size", "times --acc-steps is too large a batch", "give a smaller one"));
    }
    let tolerance = checked_overrides(&args.tolerance)?;
    let reports = reports(&args.reports)?;
    crate::report::check_targets(&reports, args.plot.as_ref(), args.force)?;
    let paths = [out.join(SAVED_FILES[0]), out.join(SAVED_FILES[1])];
    Ok(ScriptOptions {
        launcher,
        acc_steps: k,
        gpus: w,
        batch_size: args.shape.batch_size,
        out,
        timeout: args.timeout,
        sample: args.sample.clone(),
        compare: CompareOptions {
            paths,
            big: None,
            tolerance,
            reports,
            plot: args.plot.clone(),
            strict_buffers: false,
        },
        node_rank,
        fills: Vec::new(),
        quiet: false,
    })
}

/// This machine's node, where the command's DDP leg spans several: --node-rank, else the
/// command's own, else Slurm's. Every node must know it, W must share out evenly, and on one
/// node a node rank but 0 is a mistake.
fn node_rank(flag: Option<usize>, l: &crate::spec::Launcher, gpus: usize) -> Result<usize> {
    let slurm = || std::env::var("SLURM_NODEID").ok()?.trim().parse().ok();
    let fix = "give --node-rank N (0 on the node that judges), or the command's --node-rank";
    if l.nodes == 1 {
        return match flag {
            Some(r) if r > 0 => Err(Error::bad_flag(
                "--node-rank",
                format!("node {r} of a command for one node"),
                "drop it, or give torchrun --nnodes N",
            )),
            _ => Ok(0),
        };
    }
    let Some(rank) = flag.or(l.node_rank).or_else(slurm) else {
        return Err(Error::bad_flag(
            "--node-rank",
            format!("the DDP leg spans {} nodes: which is this one?", l.nodes),
            fix,
        ));
    };
    if rank >= l.nodes {
        return Err(Error::bad_flag("--node-rank", format!("node {rank} of {} nodes", l.nodes), fix));
    }
    if !gpus.is_multiple_of(l.nodes) {
        return Err(Error::bad_flag(
            "--gpus",
            format!("W={gpus} ranks do not share out over {} nodes", l.nodes),
            "give a multiple of --nnodes",
        ));
    }
    Ok(rank)
}

/// `split`'s flags: the sampling shape and the epoch, checked, and the plan's size.
pub fn split(args: &SplitArgs) -> Result<(TrainConfig, u64)> {
    let mut train = TrainConfig { shape: shape(&args.shape), ..TrainConfig::article() };
    (train.model.linear.features, train.run.epochs) = (args.shape.data_size, 1);
    plan::checks::check_split(&train)?;
    plan::memory::check_split_fits(&train, plan::memory::available_bytes)?;
    Ok((train, args.epoch))
}

fn overrides(t: &ToleranceArgs) -> ToleranceOverrides {
    ToleranceOverrides { max_ulps: t.max_ulps, rtol: t.rtol, atol: t.atol }
}

/// `--max-ulps/--rtol/--atol` checked for every dtype (explore and compare meet any).
fn checked_overrides(t: &ToleranceArgs) -> Result<ToleranceOverrides> {
    let o = overrides(t);
    for dtype in Dtype::ALL {
        check_tolerance(&o.tolerance(dtype, false))?;
    }
    Ok(o)
}

fn shape(s: &SplitShape) -> Shape {
    Shape {
        data_size: s.data_size,
        seed: s.seed,
        batch_size: s.batch_size,
        acc_steps: s.acc_steps,
        gpus: s.gpus,
        shuffle: s.shuffle,
        drop_last: s.drop_last,
    }
}

/// `--save-trace DIR`: writable, and none of the files it would write already there.
fn check_tolerance(t: &Tolerance) -> Result<()> {
    for (flag, v) in [("--rtol", t.rtol), ("--atol", t.atol)] {
        if !v.is_finite() || v < 0.0 {
            return Err(Error::bad_flag(flag, format!("{v} is not a finite non-negative number"), "pass e.g. 1e-6"));
        }
    }
    Ok(())
}
