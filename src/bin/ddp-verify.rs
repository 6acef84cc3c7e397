//! `ddp-verify`: starts a verification's W ranks itself and hands every other command
//! (explore, split, devices, --help, anything that does not parse) to `ddp-verify-core`
//! beside it. It parses with the same flag definition as the core (`ddp-verify-cli`) but
//! links no libtorch, whose static initialisation costs 0.3 s in every process that loads
//! it; the ranks need it, a process that only starts them does not.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;

use ddp_verify_cli::Verification;
use ddp_verify_launch::{self as launch, LaunchError};

fn main() {
    launch::profile::mark("main");
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let core = match std::env::current_exe() {
        Ok(exe) => exe.with_file_name("ddp-verify-core"),
        Err(e) => fail(launcher(format!("cannot locate the ddp-verify executable ({e})"), "run it by its path")),
    };
    // Beyond a few ranks, the core validates every flag (and whether W ranks fit in
    // memory) before starting any, then starts them itself.
    let here = (!launch::inside_mpi_world()).then(|| Verification::of(&args)).flatten();
    if let Some(v) = here.filter(|v| v.gpus <= launch::VALIDATE_FIRST_ABOVE) {
        match launch::relaunch(v.gpus, &core, args, Some(v.timeout)) {
            Ok(code) => launch::exit_now(code),
            Err(e) => fail(e),
        }
    }
    // Only returns if the core could not be started.
    let e = std::process::Command::new(&core).args(args).exec();
    fail(launcher(
        format!("cannot start {} ({e})", core.display()),
        "build both binaries (cargo build) or reinstall with cargo install --path .",
    ));
}

fn launcher(problem: String, fix: &str) -> LaunchError {
    LaunchError::Launcher { problem, fix: fix.into() }
}

/// One line, exit 3 (128 + the signal when interrupted), like every launcher failure of the core.
fn fail(e: LaunchError) -> ! {
    eprintln!("ddp-verify: {e}");
    launch::exit_now(e.exit().code())
}
