//! Real processes for the DDP side. On one machine `ddp-verify` starts its own W ranks
//! with Open MPI's `mpirun` (the user never types it); under a user's `mpirun` across hosts
//! it notices it is already inside an MPI world and each process acts as one rank.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

pub use super::supervise::PendingDdp;
use crate::collective::{Collective, Mpi, Nccl};
use crate::config::TrainConfig;
use crate::device::DeviceKind;
use crate::error::{Error, Result};

/// The hidden subcommand a launched rank runs.
pub const RANK_SUBCOMMAND: &str = "__rank";

/// True when Open MPI, PMIx or a PMI launcher started this process.
pub fn inside_mpi_world() -> bool {
    ["OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK"].iter().any(|v| std::env::var_os(v).is_some())
}

/// This process's rank as the launcher's environment states it, before MPI starts.
pub fn env_rank() -> Option<usize> {
    ["OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"].iter().find_map(|v| std::env::var(v).ok()?.parse().ok())
}

/// An initialised MPI world; finalised when dropped.
pub struct MpiRank {
    universe: mpi::environment::Universe,
    pub comm: Mpi,
}

impl MpiRank {
    pub fn world(&self) -> mpi::topology::SimpleCommunicator {
        self.universe.world()
    }
}

/// Initialises MPI and pins this rank to one intra-op thread (see [`pin_threads`]).
pub fn init_rank() -> Result<MpiRank> {
    let universe = mpi::initialize().ok_or_else(|| Error::Launcher {
        problem: "MPI could not be initialised (or was initialised twice)".into(),
        fix: "start ddp-verify directly, or under mpirun".into(),
    })?;
    pin_threads();
    let comm = Mpi::new(universe.world());
    Ok(MpiRank { universe, comm })
}

/// One libtorch intra-op thread in every process that trains. CPU kernels are deterministic
/// for a fixed thread count, but some split their reductions by thread (float64
/// convolution's weight gradient does), so the count decides the bits: one thread gives
/// the same bits on every machine, and the ones PyTorch's goldens were made with
/// (OMP_NUM_THREADS=1). The W ranks (plus the launcher's run) share the cores anyway.
pub fn pin_threads() {
    tch::set_num_threads(1);
}

/// Keeps freed memory for reuse instead of handing it back to the kernel. glibc serves
/// blocks over 32 MiB (a flat resnet18 state is 45 MB) with fresh mmaps and trims the heap
/// on free, so every step paid for its large tensors in zero-filled page faults again:
/// 470k faults and 1.4 s of system time in one resnet18 run, 0.2-0.3 s of its wall time.
/// Peak memory is unchanged: it is the same blocks, reused.
pub fn tune_allocator() {
    // SAFETY: mallopt only sets allocator parameters; both are valid for glibc.
    unsafe {
        libc::mallopt(libc::M_MMAP_MAX, 0);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
    }
}

/// Entry point of a rank started by [`spawn_ddp`]: trains, and rank 0 writes the trace.
pub fn rank_main(config: &Path, out: &Path) -> Result<()> {
    let text = std::fs::read_to_string(config).map_err(|e| Error::io(format!("reading {}", config.display()), e))?;
    let cfg: TrainConfig = serde_json::from_str(&text).map_err(|e| {
        Error::bad_file(config, format!("not a rank config ({e})"), "rank configs are written by ddp-verify itself")
    })?;
    let rank = init_rank()?;
    fault_hooks(rank.comm.rank());
    let comm = rank_collective(&cfg, &rank.comm)?;
    let trace = super::ddp_rank(&cfg, comm.as_ref())?;
    if rank.comm.rank() == 0 {
        trace.save(out)?;
    }
    Ok(())
}

/// What a DDP rank trains with: for CUDA runs NCCL on its own GPU (`cuda:<local rank>`),
/// its id sent over `mpi`; else `mpi` itself.
pub fn rank_collective<'a>(cfg: &TrainConfig, mpi: &'a Mpi) -> Result<Box<dyn Collective + 'a>> {
    if cfg.device == DeviceKind::Cpu {
        return Ok(Box::new(mpi));
    }
    let rank = mpi.rank();
    let gpus = crate::device::cuda_gpus().map_err(|problem| Error::Rank { rank, problem })?;
    let local = crate::device::local_rank().unwrap_or(rank);
    if local >= gpus {
        return Err(Error::Rank {
            rank,
            problem: format!(
                "is local rank {local} on its machine, which has only {gpus} GPUs; start fewer ranks per machine"
            ),
        });
    }
    Ok(Box::new(Nccl::new(mpi, local)?))
}

/// Test-only hooks so the fault tests can kill or hang a real rank:
/// `DDP_VERIFY_TEST_PID_DIR=DIR` makes each rank write `DIR/rank<r>.pid`;
/// `DDP_VERIFY_TEST_STALL=<r>` makes rank r sleep instead of training.
pub fn fault_hooks(rank: usize) {
    if let Some(dir) = std::env::var_os("DDP_VERIFY_TEST_PID_DIR") {
        let _ = std::fs::write(Path::new(&dir).join(format!("rank{rank}.pid")), std::process::id().to_string());
    }
    if std::env::var("DDP_VERIFY_TEST_STALL").ok().and_then(|r| r.parse::<usize>().ok()) == Some(rank) {
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
}

/// Starts `mpirun -np W ddp-verify __rank ...` and returns at once, so the accumulation run
/// can proceed meanwhile. The ranks must finish within `timeout`.
pub fn spawn_ddp(cfg: &TrainConfig, workdir: &Path, timeout: Duration) -> Result<PendingDdp> {
    let config = workdir.join("rank-config.json");
    let out = workdir.join("ddp.safetensors");
    let json = serde_json::to_string(cfg).expect("config serialises");
    std::fs::write(&config, json).map_err(|e| Error::io(format!("writing {}", config.display()), e))?;
    let child = mpirun_self(cfg.gpus)?
        .arg(RANK_SUBCOMMAND)
        .arg("--config")
        .arg(&config)
        .arg("--out")
        .arg(&out)
        .stderr(Stdio::piped())
        // Its own process group, so a timeout or Ctrl-C can stop mpirun and every rank at once.
        .process_group(0)
        .spawn()
        .map_err(|e| Error::Launcher {
            problem: format!("cannot start mpirun ({e})"),
            fix: "check the Open MPI install".into(),
        })?;
    Ok(PendingDdp::supervise(child, out, timeout))
}

/// Where rank 0 leaves its exit code for [`relaunch`].
const RESULT_ENV: &str = "DDP_VERIFY_RESULT_FILE";
/// When the launcher started the ranks (Unix time in ns), for the time split.
const LAUNCHED_AT_ENV: &str = "DDP_VERIFY_LAUNCHED_AT";
/// Set when the launcher's stderr is a terminal, so rank 0 may draw progress.
const PROGRESS_ENV: &str = "DDP_VERIFY_PROGRESS";

/// Runs this same command again as `np` MPI ranks and returns the exit code rank 0 left,
/// so mpirun's banners about non-zero exits never reach the user. With a `timeout` (a
/// verification) the ranks are supervised as [`spawn_ddp`]'s are: they must finish in time,
/// a rank that dies is named, and Ctrl-C stops them all. Without one (explore) rank 0 may
/// draw progress on the terminal.
pub fn relaunch(np: usize, args: impl IntoIterator<Item = OsString>, timeout: Option<Duration>) -> Result<u8> {
    use std::io::IsTerminal;
    let dir = tempfile::tempdir().map_err(|e| Error::io("creating a temporary directory", e))?;
    let result = dir.path().join("exit-code");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let mut cmd = mpirun_self(np)?;
    cmd.args(args).env(RESULT_ENV, &result).env(LAUNCHED_AT_ENV, now.to_string());
    let cannot_start = |e: std::io::Error| Error::Launcher {
        problem: format!("cannot start mpirun ({e})"),
        fix: "check the Open MPI install".into(),
    };
    let how = match timeout {
        Some(timeout) => {
            let child = cmd.stderr(Stdio::piped()).process_group(0).spawn().map_err(cannot_start)?;
            PendingDdp::supervise(child, result.clone(), timeout).finished(false)?;
            String::new()
        }
        None => {
            let progress = if std::io::stderr().is_terminal() { "1" } else { "" };
            let status = cmd.env(PROGRESS_ENV, progress).status().map_err(cannot_start)?;
            format!(" (mpirun {status})")
        }
    };
    match std::fs::read_to_string(&result).ok().and_then(|s| s.trim().parse().ok()) {
        Some(code) => Ok(code),
        None => Err(Error::Launcher {
            problem: format!("the ranks stopped before rank 0 finished{how}"),
            fix: "see the rank's message above".into(),
        }),
    }
}

/// Rank 0 under [`relaunch`]: records the exit code and returns true; false elsewhere.
pub fn leave_exit_code(code: u8) -> bool {
    match std::env::var_os(RESULT_ENV) {
        Some(path) => std::fs::write(path, code.to_string()).is_ok(),
        None => false,
    }
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

/// Seconds since the launcher started the ranks, if it said when.
pub fn seconds_since_launch() -> Option<f64> {
    let at: u128 = std::env::var(LAUNCHED_AT_ENV).ok()?.parse().ok()?;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).ok()?.as_nanos();
    Some(now.saturating_sub(at) as f64 / 1e9)
}

pub fn progress_wanted() -> bool {
    std::env::var(PROGRESS_ENV).is_ok_and(|v| v == "1")
}

/// `mpirun -np N <this executable>`, set up for one machine.
fn mpirun_self(np: usize) -> Result<Command> {
    let mpirun = find_on_path("mpirun").ok_or_else(|| Error::Launcher {
        problem: "Open MPI's mpirun is not on PATH".into(),
        fix: "install Open MPI (apt-get install openmpi-bin libopenmpi-dev, or scripts/setup.sh)".into(),
    })?;
    let exe = std::env::current_exe().map_err(|e| Error::io("locating the ddp-verify executable", e))?;
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
