//! Thin entry point: parse flags, call the library, map the outcome to an exit code.

mod cli;

use std::process::ExitCode;

use clap::Parser;

use ddp_verify::compare::Verdict;
use ddp_verify::runs::launch;
use ddp_verify::sampler::SplitPlan;
use ddp_verify::{report, verify, Result};

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    match run(args) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            if e.reported_by(launch::env_rank()) {
                eprintln!("ddp-verify: {e}");
            }
            ExitCode::from(e.exit_code())
        }
    }
}

fn run(args: cli::Cli) -> Result<u8> {
    match args.command {
        Some(cli::Command::Rank { config, out }) => launch::rank_main(&config, &out).map(|()| 0),
        Some(cli::Command::Split(split)) => {
            let train = split.train();
            train.validate_split()?;
            let plan = SplitPlan::new(&train, split.epoch);
            if split.json {
                println!("{}", serde_json::to_string(&plan).expect("plan serialises"));
            } else {
                print!("{}", plan.to_text());
            }
            Ok(0)
        }
        None => {
            let cfg = args.run.config();
            let outcome = if launch::inside_mpi_world() {
                match verify::verify_in_world(&cfg)? {
                    Some(o) => o,
                    None => return Ok(0),
                }
            } else {
                verify::verify(&cfg)?
            };
            print!("{}", report::table(&outcome));
            Ok(if outcome.verdict() == Verdict::Diverged { 1 } else { 0 })
        }
    }
}
