//! The main command's flags for a user's script (`-- COMMAND`): both legs its command, in
//! every build.

use ddp_verify_cli::RunArgs;

use super::{checked_overrides, reports};
use crate::error::{Error, Result};
use crate::evidence::SAVED_FILES;
use crate::spec::{CompareOptions, ScriptOptions};

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
            control: None,
            precision: None,
            precision_ddp: None,
            tolerance,
            reports,
            plot: args.plot.clone(),
            strict_buffers: false,
        },
        node_rank,
        fills: Vec::new(),
        quiet: false,
        no_dropout: args.no_dropout,
        cpu: args.net.device == crate::spec::DeviceRequest::Cpu,
        exit_grace: args.exit_grace,
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
