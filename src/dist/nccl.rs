//! NCCL through cudarc for GPU ranks: one GPU per rank, gradients summed on the GPUs.
//! The communicator's unique id travels over the MPI world the ranks already share, so
//! any launcher that starts MPI ranks (our own mpirun, `mpirun -H a,b`, srun) works.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::nccl::{result, sys};
use tch::{Device, Kind, Tensor};

use super::{Collective, Mpi};
use crate::error::{Error, Result};

/// One rank's NCCL communicator, beside the MPI one that carries control messages.
pub struct Nccl<'a> {
    host: &'a Mpi,
    comm: sys::ncclComm_t,
    gpu: usize,
    /// Keeps the GPU's primary context (shared with libtorch) current on this thread.
    _ctx: Arc<cudarc::driver::CudaContext>,
}

impl<'a> Nccl<'a> {
    /// Joins every rank of `host` into one NCCL communicator, this rank on GPU `gpu`.
    /// Call [`crate::dist::device::cuda_gpus`] first: it checks the libraries are there.
    pub fn new(host: &'a Mpi, gpu: usize) -> Result<Self> {
        let rank = host.rank();
        let fail = |what: &str, e: String| Error::Rank { rank, problem: format!("NCCL {what} failed ({e})") };
        let ctx =
            cudarc::driver::CudaContext::new(gpu).map_err(|e| fail("binding GPU", format!("cuda:{gpu}: {e:?}")))?;
        let mut id = if rank == 0 {
            result::get_uniqueid().map_err(|e| fail("ncclGetUniqueId", format!("{e:?}")))?
        } else {
            sys::ncclUniqueId { internal: [0; 128] }
        };
        // SAFETY: c_char and u8 have the same size and alignment.
        let bytes = unsafe { &mut *(&mut id.internal as *mut [std::ffi::c_char; 128] as *mut [u8; 128]) };
        host.broadcast_bytes(bytes, 0)?;
        let mut comm = std::mem::MaybeUninit::uninit();
        // SAFETY: `comm` is written by NCCL before it is read.
        let comm = unsafe {
            result::comm_init_rank(comm.as_mut_ptr(), host.world_size() as i32, id, rank as i32)
                .map_err(|e| fail("ncclCommInitRank", format!("{e:?}")))?;
            comm.assume_init()
        };
        Ok(Nccl { host, comm, gpu, _ctx: ctx })
    }

    fn on_gpu(&self, t: &Tensor, op: &str) -> Result<()> {
        if t.device() != Device::Cuda(self.gpu) || !t.is_contiguous() {
            return Err(Error::Rank {
                rank: self.rank(),
                problem: format!("NCCL {op} needs a contiguous tensor on cuda:{}, got {:?}", self.gpu, t.device()),
            });
        }
        Ok(())
    }

    fn check(&self, op: &str, r: std::result::Result<result::NcclStatus, result::NcclError>) -> Result<()> {
        r.map(|_| ()).map_err(|e| Error::Rank { rank: self.rank(), problem: format!("NCCL {op} failed ({e:?})") })
    }
}

/// NCCL's name for a tensor's element type.
fn nccl_type(kind: Kind) -> Option<sys::ncclDataType_t> {
    use sys::ncclDataType_t::*;
    Some(match kind {
        Kind::Float => ncclFloat32,
        Kind::Double => ncclFloat64,
        Kind::Half => ncclFloat16,
        Kind::BFloat16 => ncclBfloat16,
        Kind::Int64 => ncclInt64,
        Kind::Int => ncclInt32,
        Kind::Uint8 => ncclUint8,
        _ => return None,
    })
}

impl Collective for Nccl<'_> {
    fn rank(&self) -> usize {
        self.host.rank()
    }
    fn world_size(&self) -> usize {
        self.host.world_size()
    }
    fn all_reduce_sum(&self, data: &mut [f32]) -> Result<()> {
        self.host.all_reduce_sum(data)
    }
    fn all_reduce_sum_f64(&self, data: &mut [f64]) -> Result<()> {
        self.host.all_reduce_sum_f64(data)
    }
    fn broadcast(&self, data: &mut [f32], root: usize) -> Result<()> {
        self.host.broadcast(data, root)
    }
    fn broadcast_bytes(&self, data: &mut [u8], root: usize) -> Result<()> {
        self.host.broadcast_bytes(data, root)
    }

    fn device(&self) -> Device {
        Device::Cuda(self.gpu)
    }

    /// In place on the GPU, on the default stream libtorch computes on, so it runs after
    /// the backward that made the gradient and before anything that reads it.
    fn all_reduce_tensor(&self, t: &mut Tensor) -> Result<()> {
        self.on_gpu(t, "all-reduce")?;
        let dtype = nccl_type(t.kind()).ok_or_else(|| Error::Rank {
            rank: self.rank(),
            problem: format!("NCCL cannot sum {:?} tensors", t.kind()),
        })?;
        let ptr = t.data_ptr();
        // SAFETY: `ptr` addresses `numel` contiguous elements of `dtype` on this rank's GPU.
        let r = unsafe {
            result::all_reduce(ptr, ptr, t.numel(), dtype, sys::ncclRedOp_t::ncclSum, self.comm, std::ptr::null_mut())
        };
        self.check("all-reduce", r)
    }

    fn broadcast_tensor(&self, t: &Tensor, root: usize) -> Result<()> {
        if self.world_size() == 1 {
            return Ok(());
        }
        self.on_gpu(t, "broadcast")?;
        let (ptr, count, dtype) = match nccl_type(t.kind()) {
            Some(d) => (t.data_ptr(), t.numel(), d),
            None => (t.data_ptr(), t.numel() * t.kind().elt_size_in_bytes(), sys::ncclDataType_t::ncclUint8),
        };
        // SAFETY: as in all_reduce_tensor; root's buffer is read, every other rank's written.
        let r = unsafe {
            result::broadcast(ptr as *const c_void, ptr, count, dtype, root as i32, self.comm, std::ptr::null_mut())
        };
        self.check("broadcast", r)
    }
}

impl Drop for Nccl<'_> {
    fn drop(&mut self) {
        // SAFETY: the communicator is not used after this.
        let _ = unsafe { result::comm_destroy(self.comm) };
    }
}
