//! Real processes for the DDP side. On one machine `ddp-verify` starts its own W ranks
//! with Open MPI's `mpirun` (the user never types it); under a user's `mpirun` across hosts
//! it notices it is already inside an MPI world and each process acts as one rank.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{Collective, Mpi, Nccl};
use crate::error::{Error, Exit, Result};
use crate::spec::{DeviceKind, TrainConfig};
pub use ddp_verify_launch::{
    env_rank, exit_now, hand_back, inside_mpi_world, progress_wanted, seconds_since_launch, tell_launcher,
};

/// An initialised MPI world; finalised when dropped.
pub struct MpiRank {
    universe: mpi::environment::Universe,
    pub comm: Mpi,
}

impl MpiRank {
    pub fn world(&self) -> mpi::topology::SimpleCommunicator {
        self.universe.world()
    }

    /// A rank's failure ends every rank at once: a rank that returned and finalised MPI
    /// would leave the others waiting in a collective until --timeout. Says what failed
    /// (where this rank speaks for it), leaves rank 0's exit code for the launcher, and
    /// aborts the world. A world of one rank, or a rank told to stop by rank 0, just returns.
    pub fn fail_all<T>(&self, result: Result<T>) -> Result<T> {
        use std::io::Write;
        let e = match result {
            Err(e) if self.comm.world_size() > 1 && !matches!(e, Error::FollowerStopped) => e,
            other => return other,
        };
        let rank = self.comm.rank();
        if e.reported_by(Some(rank)) {
            let line = format!("ddp-verify: {e}");
            if !tell_launcher(&line) {
                eprintln!("{line}");
            }
        }
        if rank == 0 {
            hand_back(e.exit());
        }
        let _ = std::io::stdout().flush();
        let _ = std::io::stderr().flush();
        mpi::traits::Communicator::abort(&self.universe.world(), i32::from(e.exit().code()))
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

/// What a DDP rank trains with: for CUDA runs NCCL on its own GPU (`cuda:<local rank>`),
/// its id sent over `mpi`; else `mpi` itself.
pub fn rank_collective<'a>(cfg: &TrainConfig, mpi: &'a Mpi) -> Result<Box<dyn Collective + 'a>> {
    if cfg.run.device == DeviceKind::Cpu {
        return Ok(Box::new(mpi));
    }
    let rank = mpi.rank();
    crate::dist::device::deterministic_kernels();
    let gpus = crate::dist::device::cuda_gpus().map_err(|problem| Error::Rank { rank, problem })?;
    let local = crate::dist::device::local_rank().unwrap_or(rank);
    if let Some(shared) = cfg.run.shared_gpus {
        let device = tch::Device::Cuda(local % shared.clamp(1, gpus));
        return Ok(Box::new(super::mpi::OnDevice { mpi, device }));
    }
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
    if chosen("DDP_VERIFY_TEST_STALL", rank) {
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
}

/// `DDP_VERIFY_TEST_FAIL=<r>`: rank r fails once the others are past the go-ahead, as a
/// rank that meets an error in the middle of training would.
pub fn failure_hook(rank: usize) -> Result<()> {
    match chosen("DDP_VERIFY_TEST_FAIL", rank) {
        true => Err(Error::Rank { rank, problem: "failing on purpose (DDP_VERIFY_TEST_FAIL)".into() }),
        false => Ok(()),
    }
}

fn chosen(var: &str, rank: usize) -> bool {
    std::env::var(var).ok().and_then(|r| r.parse::<usize>().ok()) == Some(rank)
}

/// Runs this same command again as `np` MPI ranks; see [`ddp_verify_launch::relaunch`].
pub fn relaunch(np: usize, args: impl IntoIterator<Item = OsString>, timeout: Option<Duration>) -> Result<Exit> {
    Ok(Exit::from_code(ddp_verify_launch::relaunch(np, &this_executable()?, args, timeout)?))
}

fn this_executable() -> Result<PathBuf> {
    std::env::current_exe().map_err(|e| Error::io("locating the ddp-verify executable", e))
}
