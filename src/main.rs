//! `ddp-verify-core`: parse → lower → dispatch → exit. Each rank of a verification runs
//! this, as does any other command; `ddp-verify` (src/bin) only starts ranks.

use ddp_verify::dispatch::{self, validate_only};
use ddp_verify::dist::{kernels, world};
use ddp_verify::{jobs, lower, Exit, Result};
use ddp_verify_cli::{Cli, Command, Parser};

fn main() {
    ddp_verify::profile::mark("main");
    if world::inside_mpi_world() {
        ddp_verify_launch::die_with_parent();
    }
    let exit = match Cli::try_parse() {
        Ok(cli) => run(cli).unwrap_or_else(|e| {
            if e.reported_by(world::env_rank()) {
                eprintln!("ddp-verify: {e}");
            }
            e.exit()
        }),
        Err(e) if !e.use_stderr() => {
            let _ = e.print(); // --help, --version
            Exit::Equivalent
        }
        Err(e) => {
            // Started as ranks by `ddp-verify`, every rank parses the same flags: rank 0 speaks.
            if world::env_rank().unwrap_or(0) == 0 {
                eprintln!("ddp-verify: {}", ddp_verify_cli::usage_line(&e));
            }
            Exit::BadInput
        }
    };
    world::exit_now(world::hand_back(exit))
}

fn run(cli: Cli) -> Result<Exit> {
    if let Some(done) = dispatch::without_libtorch(&cli) {
        return done;
    }
    match cli.command {
        Some(Command::Devices { gpus, kernels }) => jobs::devices(gpus, lower::kernel_mode(&kernels, None)?),
        Some(Command::Suite(args)) => {
            let suite = lower::suite(&args)?;
            if validate_only() {
                return Ok(Exit::Equivalent);
            }
            jobs::suite::command(&suite)
        }
        Some(Command::Explore(args)) => {
            let options = lower::explore::models(&args)?;
            kernels::apply(options.kernels, ddp_verify::spec::DeviceKind::Cpu)?;
            if validate_only() {
                return Ok(Exit::Equivalent);
            }
            jobs::explore::models::command(&options)
        }
        // The main job (compare, split and `-- COMMAND` were run above).
        _ => {
            let cfg = lower::verification(&cli.run)?;
            // Before anything makes a tensor: that fixes libtorch's kernels for the process.
            kernels::apply(cfg.kernels, cfg.train.run.device)?;
            if !world::inside_mpi_world() {
                // Both runs happen inside one MPI world of W ranks: refuse bad input here,
                // before starting them.
                jobs::preflight(&cfg)?;
                if validate_only() {
                    return Ok(Exit::Equivalent);
                }
            }
            jobs::verify::command(&cfg)
        }
    }
}
