//! Open MPI through rsmpi: the CPU ranks' engine, and the launcher's control channel.

use std::cell::Cell;
use std::time::{Duration, Instant};

use mpi::collective::SystemOperation;
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::traits::*;

use tch::{Device, Kind, Tensor};

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
        self.arrive();
        let out = op(&self.comm);
        self.busy.set(self.busy.get() + start.elapsed());
        out
    }
}

impl Mpi {
    /// Waits, mostly asleep, until every rank has reached this collective. Open MPI's
    /// blocking collectives spin while they wait; the ranks (and rank 0's accumulation
    /// thread) share the cores, so a spinning rank would take a core from the ones it
    /// waits for. Once all have arrived the blocking collective runs without waiting.
    fn arrive(&self) {
        if self.comm.size() == 1 {
            return;
        }
        let mut request = self.comm.immediate_barrier();
        let mut nap = Duration::from_micros(20);
        let spin_until = Instant::now() + Duration::from_micros(50);
        loop {
            match request.test() {
                Ok(_) => return,
                Err(pending) => request = pending,
            }
            if Instant::now() >= spin_until {
                std::thread::sleep(nap);
                nap = (nap * 2).min(Duration::from_millis(1));
            }
        }
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

    /// In the tensor's own memory when it is a contiguous float32/float64 CPU tensor: a
    /// whole model's gradients are tens of MB, and every copy of them costs time.
    fn all_reduce_tensor(&self, t: &mut Tensor) -> Result<()> {
        if !in_host_memory(t) || !matches!(t.kind(), Kind::Float | Kind::Double) {
            return super::all_reduce_through_host(self, t);
        }
        let sum = t.empty_like();
        // SAFETY: both are contiguous CPU tensors of this dtype and `numel` elements, and
        // distinct allocations; nothing else touches them during the call.
        unsafe {
            match t.kind() {
                Kind::Float => self.timed(|c| {
                    c.all_reduce_into(host_slice::<f32>(t), host_slice::<f32>(&sum), SystemOperation::sum())
                }),
                _ => self.timed(|c| {
                    c.all_reduce_into(host_slice::<f64>(t), host_slice::<f64>(&sum), SystemOperation::sum())
                }),
            }
        }
        tch::no_grad(|| t.copy_(&sum));
        Ok(())
    }

    fn broadcast_tensor(&self, t: &Tensor, root: usize) -> Result<()> {
        if self.world_size() == 1 {
            return Ok(());
        }
        if !in_host_memory(t) {
            return super::broadcast_through_host(self, t, root);
        }
        // SAFETY: a contiguous CPU tensor's bytes; nothing else touches it during the call.
        unsafe { self.broadcast_bytes(host_slice::<u8>(t), root) }
    }
}

/// Open MPI for ranks whose tensors live on a GPU they share with other ranks (NCCL refuses
/// two ranks on one device): every all-reduce and broadcast goes through host copies.
pub struct OnDevice<'a> {
    pub mpi: &'a Mpi,
    pub device: Device,
}

impl Collective for OnDevice<'_> {
    fn rank(&self) -> usize {
        self.mpi.rank()
    }
    fn world_size(&self) -> usize {
        self.mpi.world_size()
    }
    fn all_reduce_sum(&self, data: &mut [f32]) -> Result<()> {
        self.mpi.all_reduce_sum(data)
    }
    fn all_reduce_sum_f64(&self, data: &mut [f64]) -> Result<()> {
        self.mpi.all_reduce_sum_f64(data)
    }
    fn broadcast(&self, data: &mut [f32], root: usize) -> Result<()> {
        self.mpi.broadcast(data, root)
    }
    fn broadcast_bytes(&self, data: &mut [u8], root: usize) -> Result<()> {
        self.mpi.broadcast_bytes(data, root)
    }
    fn device(&self) -> Device {
        self.device
    }
    fn all_reduce_tensor(&self, t: &mut Tensor) -> Result<()> {
        self.mpi.all_reduce_tensor(t)
    }
    fn broadcast_tensor(&self, t: &Tensor, root: usize) -> Result<()> {
        self.mpi.broadcast_tensor(t, root)
    }
}

/// Whether MPI can work on the tensor's own memory.
fn in_host_memory(t: &Tensor) -> bool {
    t.device() == Device::Cpu && t.is_contiguous() && t.numel() > 0
}

/// A contiguous, non-empty CPU tensor's memory as elements of `T` (bytes when `T` is u8).
///
/// # Safety
/// `T` must be the tensor's element type or u8, and the slice must not outlive the tensor
/// nor alias another live slice of it.
// A Tensor is a handle: libtorch owns the memory, which the caller lends to MPI.
#[allow(clippy::mut_from_ref)]
unsafe fn host_slice<T>(t: &Tensor) -> &mut [T] {
    let bytes = t.numel() * t.kind().elt_size_in_bytes();
    std::slice::from_raw_parts_mut(t.data_ptr().cast::<T>(), bytes / std::mem::size_of::<T>())
}
