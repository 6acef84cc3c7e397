//! Open MPI through rsmpi: the CPU ranks' engine, and the launcher's control channel.

use std::cell::Cell;
use std::time::{Duration, Instant};

use mpi::collective::SystemOperation;
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::traits::*;

use super::Collective;
use crate::error::Result;

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
