//! `ddp-verify`: starts a verification's W ranks itself and hands every other command
//! (explore, split, devices, --help, anything that does not parse) to `ddp-verify-core`
//! beside it. It parses with the same flag definition as the core (`ddp-verify-cli`) but
//! links no libtorch, whose static initialisation costs 0.3 s in every process that loads
//! it; the ranks need it, a process that only starts them does not.
//!
//! Built without the `libtorch` feature (the wheel), there is no core: it runs `compare`,
//! `split` and `-- COMMAND` itself, by the library's one code path for them.

#[cfg(feature = "libtorch")]
use std::ffi::OsString;
#[cfg(feature = "libtorch")]
use std::os::unix::process::CommandExt;

#[cfg(feature = "libtorch")]
use ddp_verify_cli::Verification;
use ddp_verify_launch as launch;
#[cfg(feature = "libtorch")]
use ddp_verify_launch::LaunchError;

#[cfg(feature = "libtorch")]
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

#[cfg(feature = "libtorch")]
fn launcher(problem: String, fix: &str) -> LaunchError {
    LaunchError::Launcher { problem, fix: fix.into() }
}

/// One line, exit 3 (128 + the signal when interrupted), like every launcher failure of the core.
#[cfg(feature = "libtorch")]
fn fail(e: LaunchError) -> ! {
    eprintln!("ddp-verify: {e}");
    launch::exit_now(e.exit().code())
}

/// The pip package's `ddp-verify`, built without libtorch: judges traces and users' scripts
/// itself (the same code `ddp-verify-core` runs for them) and says how to get the rest.
#[cfg(not(feature = "libtorch"))]
fn main() {
    use ddp_verify::dispatch;
    use ddp_verify_cli::{Cli, Exit, Parser};

    let exit = match Cli::try_parse() {
        Ok(cli) => match dispatch::without_libtorch(&cli) {
            Some(done) => done.unwrap_or_else(|e| {
                eprintln!("ddp-verify: {e}");
                e.exit()
            }),
            None => {
                eprintln!("ddp-verify: {}", dispatch::NEEDS_LIBTORCH);
                Exit::BadInput
            }
        },
        Err(e) if !e.use_stderr() => {
            let _ = e.print(); // --help, --version
            Exit::Equivalent
        }
        Err(e) => {
            eprintln!("ddp-verify: {}", ddp_verify_cli::usage_line(&e));
            Exit::BadInput
        }
    };
    launch::exit_now(exit.code())
}
