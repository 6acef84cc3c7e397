//! `ddp-verify`: starts a verification's W ranks itself and hands every other command
//! (explore, split, devices, --help) to `ddp-verify-core` beside it. It links no libtorch, whose static
//! initialisation costs 0.3 s in every process that loads it; the ranks need it, a
//! process that only starts them does not.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;

use ddp_verify_launch as launch;

fn main() {
    launch::profile::mark("main");
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let core = match std::env::current_exe() {
        Ok(exe) => exe.with_file_name("ddp-verify-core"),
        Err(e) => fail(&format!("cannot locate the ddp-verify executable ({e})")),
    };
    if let Some(plan) = launch::front::plan(&args) {
        launch::profile::mark("relaunching");
        let code = match launch::relaunch(plan.gpus, &core, args, Some(plan.timeout)) {
            Ok(code) => code,
            Err(e) => {
                eprintln!("ddp-verify: {e}");
                3
            }
        };
        launch::profile::mark("ranks done");
        launch::exit_now(code);
    }
    // Only returns if the core could not be started.
    let e = std::process::Command::new(&core).args(args).exec();
    fail(&format!(
        "cannot start {} ({e}); build both binaries (cargo build) or reinstall with cargo install --path .",
        core.display()
    ));
}

fn fail(problem: &str) -> ! {
    eprintln!("ddp-verify: launcher: {problem}");
    std::process::exit(3)
}
