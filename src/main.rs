//! Thin entry point: parse flags, call the library, map the outcome to an exit code.

mod cli;

use std::process::ExitCode;

use clap::Parser;

use ddp_verify::compare::Verdict;
use ddp_verify::runs::launch;
use ddp_verify::sampler::SplitPlan;
use ddp_verify::{explore, report, verify, Result};

fn main() -> ExitCode {
    let code = exit_code();
    launch::exit_now(code)
}

fn exit_code() -> u8 {
    ddp_verify::profile::mark("main");
    if launch::inside_mpi_world() {
        ddp_verify_launch::die_with_parent();
    }
    let args = match cli::Cli::try_parse() {
        Ok(args) => args,
        Err(e) if !e.use_stderr() => {
            let _ = e.print(); // --help, --version
            return 0;
        }
        Err(e) => {
            // One line, like every other bad input: clap's first line names the flag.
            let text = e.render().to_string();
            let paragraph: Vec<&str> = text.lines().take_while(|l| !l.trim().is_empty()).map(str::trim).collect();
            let first = paragraph.join(" ");
            let first = first.trim_start_matches("error: ");
            // Started as ranks by `ddp-verify`, every rank parses the same flags: rank 0 speaks.
            if launch::env_rank().unwrap_or(0) == 0 {
                eprintln!("ddp-verify: {first} (see ddp-verify --help)");
            }
            return if launch::leave_exit_code(2) { 0 } else { 2 };
        }
    };
    match run(args) {
        Ok(code) => code,
        Err(e) => {
            if e.reported_by(launch::env_rank()) {
                eprintln!("ddp-verify: {e}");
            }
            if launch::leave_exit_code(e.exit_code()) {
                return 0;
            }
            e.exit_code()
        }
    }
}

/// Test hook (`DDP_VERIFY_TEST_VALIDATE_ONLY=1`): stop after every check made before a
/// rank starts, so the flag fuzzer covers parsing, lowering and validation without training.
fn validate_only() -> bool {
    std::env::var_os("DDP_VERIFY_TEST_VALIDATE_ONLY").is_some()
}

fn run(args: cli::Cli) -> Result<u8> {
    match args.command {
        Some(cli::Command::Devices { gpus }) => {
            print!("{}", ddp_verify::device::describe(gpus));
            Ok(0)
        }
        Some(cli::Command::Explore(explore)) => {
            let options = explore.options()?;
            if validate_only() {
                return Ok(0);
            }
            explore::command(&options)
        }
        Some(cli::Command::Split(split)) => {
            let train = split.train();
            train.validate_split()?;
            ddp_verify::data::check_split_fits(&train)?;
            let plan = SplitPlan::new(&train, split.epoch);
            if split.json {
                println!("{}", serde_json::to_string(&plan).expect("plan serialises"));
            } else {
                print!("{}", plan.to_text());
            }
            Ok(0)
        }
        None => {
            let cfg = args.run.config()?;
            if !launch::inside_mpi_world() {
                // Both runs happen inside one MPI world of W ranks: refuse bad input here,
                // then run this same command as those ranks. (`ddp-verify` usually starts
                // them itself and this binary only ever runs inside the world.)
                verify::prepare(&cfg)?;
                if validate_only() {
                    return Ok(0);
                }
                let timeout = std::time::Duration::try_from_secs_f64(cfg.timeout_s).unwrap_or(std::time::Duration::MAX);
                return launch::relaunch(cfg.train.gpus, std::env::args_os().skip(1), Some(timeout));
            }
            let Some(outcome) = verify::verify_in_world(&cfg)? else {
                return Ok(0);
            };
            ddp_verify::profile::mark("outcome");
            report::write_all(&outcome, &cfg.reports)?;
            ddp_verify::profile::mark("reported");
            let code = if outcome.verdict() == Verdict::Diverged { 1 } else { 0 };
            // Under our own relaunch, rank 0 hands its code back through a file.
            Ok(if launch::leave_exit_code(code) { 0 } else { code })
        }
    }
}
