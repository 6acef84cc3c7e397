//! The collective engine behind DDP, as one small trait: Open MPI (rsmpi) for CPU ranks
//! today, so an NCCL backend for GPUs can slot in beside it.

use std::cell::Cell;
use std::time::{Duration, Instant};

use mpi::collective::SystemOperation;
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::traits::*;
use tch::{Kind, Tensor};

use crate::error::{Error, Result};

pub trait Collective {
    fn rank(&self) -> usize;
    fn world_size(&self) -> usize;
    /// Element-wise sum over all ranks, result on every rank.
    fn all_reduce_sum(&self, data: &mut [f32]) -> Result<()>;
    /// Element-wise sum over all ranks, in float64 (`--dtype float64`).
    fn all_reduce_sum_f64(&self, data: &mut [f64]) -> Result<()>;
    /// Copies `root`'s data to every rank.
    fn broadcast(&self, data: &mut [f32], root: usize) -> Result<()>;
    /// Copies `root`'s bytes to every rank: buffers of any dtype (int64 counters included).
    fn broadcast_bytes(&self, data: &mut [u8], root: usize) -> Result<()>;
}

/// One rank whose collectives do nothing: a world of one (`Idle { rank: 0, world: 1 }`),
/// or one rank's share of the compute timed alone (`examples/pure_compute.rs`).
pub struct Idle {
    pub rank: usize,
    pub world: usize,
}

impl Collective for Idle {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world
    }
    fn all_reduce_sum(&self, _data: &mut [f32]) -> Result<()> {
        Ok(())
    }
    fn all_reduce_sum_f64(&self, _data: &mut [f64]) -> Result<()> {
        Ok(())
    }
    fn broadcast(&self, _data: &mut [f32], _root: usize) -> Result<()> {
        Ok(())
    }
    fn broadcast_bytes(&self, _data: &mut [u8], _root: usize) -> Result<()> {
        Ok(())
    }
}

/// An MPI communicator (the world, or the first W ranks of it).
pub struct Mpi {
    comm: SimpleCommunicator,
    /// Time spent inside collectives, for the explore time split.
    busy: Cell<Duration>,
}

impl Mpi {
    pub fn new(comm: SimpleCommunicator) -> Self {
        Mpi { comm, busy: Cell::new(Duration::ZERO) }
    }

    pub fn comm_seconds(&self) -> f64 {
        self.busy.get().as_secs_f64()
    }

    fn timed<T>(&self, op: impl FnOnce(&SimpleCommunicator) -> T) -> T {
        let start = Instant::now();
        let out = op(&self.comm);
        self.busy.set(self.busy.get() + start.elapsed());
        out
    }
}

impl Collective for Mpi {
    fn rank(&self) -> usize {
        self.comm.rank() as usize
    }
    fn world_size(&self) -> usize {
        self.comm.size() as usize
    }
    fn all_reduce_sum(&self, data: &mut [f32]) -> Result<()> {
        let send = data.to_vec();
        self.timed(|c| c.all_reduce_into(&send[..], data, SystemOperation::sum()));
        Ok(())
    }
    fn all_reduce_sum_f64(&self, data: &mut [f64]) -> Result<()> {
        let send = data.to_vec();
        self.timed(|c| c.all_reduce_into(&send[..], data, SystemOperation::sum()));
        Ok(())
    }
    fn broadcast(&self, data: &mut [f32], root: usize) -> Result<()> {
        self.timed(|c| c.process_at_rank(root as i32).broadcast_into(data));
        Ok(())
    }
    fn broadcast_bytes(&self, data: &mut [u8], root: usize) -> Result<()> {
        self.timed(|c| c.process_at_rank(root as i32).broadcast_into(data));
        Ok(())
    }
}

/// All-reduces (sums) a float32 or float64 CPU tensor in place.
pub fn all_reduce_tensor(comm: &dyn Collective, t: &mut Tensor) -> Result<()> {
    if t.kind() == Kind::Double {
        let mut values = Vec::<f64>::try_from(&t.flatten(0, -1))?;
        comm.all_reduce_sum_f64(&mut values)?;
        tch::no_grad(|| t.copy_(&Tensor::from_slice(&values).view_as(t)));
        return Ok(());
    }
    with_values(t, |v| comm.all_reduce_sum(v))
}

/// Copies `root`'s tensor into every rank's tensor of the same shape and dtype.
pub fn broadcast_tensor(comm: &dyn Collective, t: &Tensor, root: usize) -> Result<()> {
    if comm.world_size() == 1 {
        return Ok(());
    }
    let numel = t.numel();
    let mut bytes = vec![0u8; numel * t.kind().elt_size_in_bytes()];
    t.f_copy_data_u8(&mut bytes, numel)?;
    comm.broadcast_bytes(&mut bytes, root)?;
    let got = Tensor::f_from_data_size(&bytes, &t.size(), t.kind())?;
    tch::no_grad(|| t.shallow_clone().copy_(&got));
    Ok(())
}

/// Applies `op` to a float32 CPU tensor's values in place.
pub fn with_values(t: &mut Tensor, op: impl FnOnce(&mut [f32]) -> Result<()>) -> Result<()> {
    if t.kind() != Kind::Float {
        return Err(Error::Rank { rank: 0, problem: format!("collective needs float32 tensors, got {:?}", t.kind()) });
    }
    let mut values = Vec::<f32>::try_from(&t.flatten(0, -1))?;
    op(&mut values)?;
    tch::no_grad(|| t.copy_(&Tensor::from_slice(&values).view_as(t)));
    Ok(())
}
