//! Starting and watching ddp-verify's MPI ranks, with nothing of libtorch: the
//! `ddp-verify` executable is this crate alone and hands everything it does not start
//! itself to `ddp-verify-core` (the whole tool), so the common case does not pay
//! libtorch's static initialisation once more in a process that computes nothing.

mod error;
pub mod profile;
mod supervise;

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

pub use ddp_verify_cli::Exit;
pub use error::{LaunchError, Result};
use supervise::Supervised;
pub use supervise::{Lingered, Lingerer};

/// Above this many ranks the core validates everything before any rank starts: a bad flag
/// should not first cost W processes of about 110 MiB each. Up to it, starting the ranks at
/// once and letting rank 0 validate costs less than loading libtorch once more.
pub const VALIDATE_FIRST_ABOVE: usize = 4;

/// True when Open MPI, PMIx or a PMI launcher started this process.
pub fn inside_mpi_world() -> bool {
    ["OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK"].iter().any(|v| std::env::var_os(v).is_some())
}

/// This process's rank as the launcher's environment states it, before MPI starts.
pub fn env_rank() -> Option<usize> {
    ["OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"].iter().find_map(|v| std::env::var(v).ok()?.parse().ok())
}

/// Where rank 0 leaves its exit code for [`relaunch`].
const RESULT_ENV: &str = "DDP_VERIFY_RESULT_FILE";
/// When the launcher started the ranks (Unix time in ns), for the time split.
const LAUNCHED_AT_ENV: &str = "DDP_VERIFY_LAUNCHED_AT";
/// Set when the launcher's stderr is a terminal, so rank 0 may draw progress.
const PROGRESS_ENV: &str = "DDP_VERIFY_PROGRESS";

/// Runs `exe args` as `np` MPI ranks and returns the exit code rank 0 left, so mpirun's
/// banners about non-zero exits never reach the user. With a `timeout` (a verification)
/// the ranks are supervised: they must finish in time, a rank that dies is named, and
/// Ctrl-C stops them all. Without one (explore) rank 0 may draw progress on the terminal.
pub fn relaunch(
    np: usize,
    exe: &Path,
    args: impl IntoIterator<Item = OsString>,
    timeout: Option<Duration>,
) -> Result<u8> {
    use std::io::IsTerminal;
    profile::mark("relaunching");
    let dir = tempfile::tempdir().map_err(|e| LaunchError::io("creating a temporary directory", e))?;
    let result = dir.path().join("exit-code");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let mut cmd = mpirun(np, exe)?;
    cmd.args(args).env(RESULT_ENV, &result).env(LAUNCHED_AT_ENV, now.to_string());
    // Open MPI's session directory and shared-memory segments go in our own temporary
    // directory, removed when we return, also after a rank or mpirun was killed.
    for (var, value) in
        [("OMPI_MCA_orte_tmpdir_base", dir.path()), ("OMPI_MCA_btl_vader_backing_directory", dir.path())]
    {
        if std::env::var_os(var).is_none() {
            cmd.env(var, value);
        }
    }
    // SAFETY: prctl is async-signal-safe; between fork and exec nothing else runs.
    // mpirun is told to stop (and so to stop its ranks) when this process dies, even of
    // a KILL that no handler sees.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
    // The ranks' standard output (the reports) passes through us, so a failed write of the
    // verdict (a full disk, `> /dev/full`) is an error, not a silent pass.
    cmd.stdout(Stdio::piped());
    let supervised = match timeout {
        // A verification: must finish in time; Open MPI's banners read, not shown.
        Some(timeout) => {
            let child = cmd.stderr(Stdio::piped()).process_group(0).spawn().map_err(cannot_start)?;
            Supervised::new(child, Some(timeout))
        }
        // explore: no deadline, and stderr left to rank 0's progress line.
        None => {
            let progress = if std::io::stderr().is_terminal() { "1" } else { "" };
            let child = cmd.env(PROGRESS_ENV, progress).process_group(0).spawn().map_err(cannot_start)?;
            Supervised::new(child, None)
        }
    };
    let (supervised, forward) = supervised.forwarding_stdout();
    let done = supervised.finished();
    let forwarded = forward.join().unwrap_or(Ok(()));
    remove_partials(&result);
    for line in std::fs::read_to_string(messages_file(&result)).unwrap_or_default().lines() {
        eprintln!("{line}");
    }
    profile::mark("ranks done");
    forwarded.map_err(|e| LaunchError::io("writing the report to standard output", e))?;
    // Rank 0's verdict stands even when mpirun then complained about the others.
    match std::fs::read_to_string(&result).ok().and_then(|s| s.trim().parse().ok()) {
        Some(code) => Ok(code),
        None => Err(done.err().unwrap_or_else(|| LaunchError::Launcher {
            problem: "the ranks stopped before rank 0 finished".into(),
            fix: "see the rank's message above".into(),
        })),
    }
}

/// Runs one leg of a user's training command (`ddp-verify -- python train.py`) supervised as
/// the ranks are: a process group of its own that dies with us, a deadline, Ctrl-C stopping
/// all of it; its output goes to `log`, and `tick` hears the time since it started about
/// four times a second. Returns its exit status, whatever it is. Where `done` says its work is
/// complete (the trace written) and it is still running a grace period later (a rank hung in
/// its process group's teardown at exit), it is stopped, and who lingered is returned.
pub fn run_leg(
    mut cmd: Command,
    log: &Path,
    timeout: Duration,
    what: &str,
    tick: &mut dyn FnMut(Duration),
    done: Option<(&dyn Fn() -> bool, Duration)>,
) -> Result<(std::process::ExitStatus, Option<Lingered>)> {
    let file = std::fs::File::create(log).map_err(|e| LaunchError::io(format!("creating {}", log.display()), e))?;
    let err = file.try_clone().map_err(|e| LaunchError::io(format!("opening {}", log.display()), e))?;
    cmd.stdin(Stdio::null()).stdout(file).stderr(err);
    // SAFETY: prctl is async-signal-safe; between fork and exec nothing else runs.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
    let child = cmd.process_group(0).spawn().map_err(|e| LaunchError::Launcher {
        problem: format!("cannot start {what} ({e})"),
        fix: "check the command after --".into(),
    })?;
    let mut supervised = Supervised::new(child, Some(timeout));
    supervised.exited_until(what, tick, done)
}

/// For a rank: die with the process that started it (mpirun, or Open MPI's daemon), so a
/// killed launcher never leaves ranks running, hung ones included.
pub fn die_with_parent() {
    // SAFETY: plain syscalls on this process.
    unsafe {
        let parent = libc::getppid();
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        // The parent may have died before the call: then we were reparented already.
        if libc::getppid() != parent {
            libc::_exit(3);
        }
    }
}

fn cannot_start(e: std::io::Error) -> LaunchError {
    LaunchError::Launcher { problem: format!("cannot start mpirun ({e})"), fix: "check the Open MPI install".into() }
}

/// A file a rank is writing and will finish or remove itself; should the ranks be stopped
/// first (a killed rank runs no cleanup), [`relaunch`] removes it once they are gone.
pub fn register_partial(path: &Path) {
    use std::io::Write;
    let Some(result) = std::env::var_os(RESULT_ENV) else { return };
    let list = PathBuf::from(format!("{}.partial", PathBuf::from(result).display()));
    let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    // One write of the whole line: appends from several processes do not interleave.
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(list) {
        let _ = f.write_all(format!("{}\n", path.display()).as_bytes());
    }
}

/// For a rank about to abort the world: its message goes to the launcher through a file,
/// which [`relaunch`] prints once mpirun is done. Through mpirun's stderr forwarding, the
/// abort could kill the rank before its last lines were passed on. False where no
/// launcher of ours listens (the caller prints the line itself).
pub fn tell_launcher(line: &str) -> bool {
    use std::io::Write;
    let Some(result) = std::env::var_os(RESULT_ENV) else { return false };
    // One write of the whole line: appends from several ranks do not interleave.
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(messages_file(Path::new(&result)))
        .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()))
        .is_ok()
}

fn messages_file(result: &Path) -> PathBuf {
    PathBuf::from(format!("{}.messages", result.display()))
}

/// Removes what [`register_partial`] listed and is still there.
fn remove_partials(result: &Path) {
    let list = PathBuf::from(format!("{}.partial", result.display()));
    for line in std::fs::read_to_string(list).unwrap_or_default().lines() {
        let _ = std::fs::remove_file(line);
    }
}

/// The code this process ends with. A rank under [`relaunch`] hands `exit` to the launcher
/// through a file and ends with 0, so mpirun's banners about non-zero exits never show.
/// Rank 0 speaks for the world; another rank only when it failed (its success must not
/// overwrite rank 0's verdict). Anywhere else the process ends with `exit`'s own code.
pub fn hand_back(exit: Exit) -> u8 {
    let speaks = env_rank().unwrap_or(0) == 0 || exit != Exit::Equivalent;
    let handed = speaks
        && std::env::var_os(RESULT_ENV).is_some_and(|path| std::fs::write(path, exit.code().to_string()).is_ok());
    if handed {
        0
    } else {
        exit.code()
    }
}

/// Seconds since the launcher started the ranks, if it said when.
pub fn seconds_since_launch() -> Option<f64> {
    let at: u128 = std::env::var(LAUNCHED_AT_ENV).ok()?.parse().ok()?;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).ok()?.as_nanos();
    Some(now.saturating_sub(at) as f64 / 1e9)
}

pub fn progress_wanted() -> bool {
    std::env::var(PROGRESS_ENV).is_ok_and(|v| v == "1")
}

/// `mpirun -np N exe`, set up for one machine.
pub fn mpirun(np: usize, exe: &Path) -> Result<Command> {
    let mpirun = find_on_path("mpirun").ok_or_else(|| LaunchError::Launcher {
        problem: "Open MPI's mpirun is not on PATH".into(),
        fix: "install Open MPI (apt-get install openmpi-bin libopenmpi-dev, or scripts/setup.sh)".into(),
    })?;
    let mut cmd = Command::new(mpirun);
    cmd.args(["-np", &np.to_string(), "--oversubscribe", "--bind-to", "none"])
        .arg(exe)
        // Open MPI refuses root without these; CI containers run as root.
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .stdin(Stdio::null());
    // Every rank is on this machine: shared memory only. Probing for UCX and network
    // transports took 0.2 s of each rank's MPI_Init; 0.05 s without. A user's own
    // OMPI_MCA_* settings win.
    for (var, value) in [("OMPI_MCA_pml", "ob1"), ("OMPI_MCA_btl", "self,vader")] {
        if std::env::var_os(var).is_none() {
            cmd.env(var, value);
        }
    }
    Ok(cmd)
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?).map(|d| d.join(name)).find(|p| p.is_file())
}

/// Ends the process with `code` once output is flushed, skipping libtorch's static
/// destructors and the freeing of every tensor still alive: that teardown took 0.15 s of
/// each process's exit, and the kernel reclaims the memory anyway. MPI is finalised and
/// every file this run writes is closed by the time this is called.
pub fn exit_now(code: u8) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: _exit ends the process; nothing runs after it.
    unsafe { libc::_exit(i32::from(code)) }
}
