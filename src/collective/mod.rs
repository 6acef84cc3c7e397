//! The collective engine behind DDP, as one small trait: Open MPI (rsmpi) for CPU ranks,
//! NCCL (cudarc) for GPU ranks. Slices carry the launcher's small control messages; tensors
//! carry gradients and state, and stay on the device where the backend can reach them.

mod mpi;
mod nccl;

pub use self::mpi::Mpi;
pub use self::nccl::Nccl;

use tch::{Device, Kind, Tensor};

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

    /// Where this rank's tensors live.
    fn device(&self) -> Device {
        Device::Cpu
    }

    /// Sums a floating tensor over all ranks in place (through host memory here; NCCL
    /// reduces on the GPU). bfloat16 and float16 are summed in float32 and rounded once,
    /// which for two ranks is exactly gloo's and NCCL's rounded sum.
    fn all_reduce_tensor(&self, t: &mut Tensor) -> Result<()> {
        let host = t.to_device(Device::Cpu).contiguous();
        let host = if matches!(host.kind(), Kind::BFloat16 | Kind::Half) { host.to_kind(Kind::Float) } else { host };
        let summed = match host.kind() {
            Kind::Double => {
                let mut values = Vec::<f64>::try_from(&host.flatten(0, -1))?;
                self.all_reduce_sum_f64(&mut values)?;
                Tensor::from_slice(&values)
            }
            Kind::Float => {
                let mut values = Vec::<f32>::try_from(&host.flatten(0, -1))?;
                self.all_reduce_sum(&mut values)?;
                Tensor::from_slice(&values)
            }
            kind => {
                return Err(Error::Rank {
                    rank: self.rank(),
                    problem: format!("all-reduce needs floating tensors, got {kind:?}"),
                })
            }
        };
        // copy_ rounds back to the tensor's own dtype.
        tch::no_grad(|| t.copy_(&summed.view_as(t)));
        Ok(())
    }

    /// Copies `root`'s tensor into every rank's tensor of the same shape and dtype.
    fn broadcast_tensor(&self, t: &Tensor, root: usize) -> Result<()> {
        if self.world_size() == 1 {
            return Ok(());
        }
        let host = t.to_device(Device::Cpu).contiguous();
        let numel = host.numel();
        let mut bytes = vec![0u8; numel * host.kind().elt_size_in_bytes()];
        host.f_copy_data_u8(&mut bytes, numel)?;
        self.broadcast_bytes(&mut bytes, root)?;
        let got = Tensor::f_from_data_size(&bytes, &t.size(), t.kind())?;
        tch::no_grad(|| t.shallow_clone().copy_(&got));
        Ok(())
    }
}

/// A borrowed engine is an engine, so a rank holds MPI or NCCL behind one `Box`.
impl<C: Collective + ?Sized> Collective for &C {
    fn rank(&self) -> usize {
        (**self).rank()
    }
    fn world_size(&self) -> usize {
        (**self).world_size()
    }
    fn all_reduce_sum(&self, data: &mut [f32]) -> Result<()> {
        (**self).all_reduce_sum(data)
    }
    fn all_reduce_sum_f64(&self, data: &mut [f64]) -> Result<()> {
        (**self).all_reduce_sum_f64(data)
    }
    fn broadcast(&self, data: &mut [f32], root: usize) -> Result<()> {
        (**self).broadcast(data, root)
    }
    fn broadcast_bytes(&self, data: &mut [u8], root: usize) -> Result<()> {
        (**self).broadcast_bytes(data, root)
    }
    fn device(&self) -> Device {
        (**self).device()
    }
    fn all_reduce_tensor(&self, t: &mut Tensor) -> Result<()> {
        (**self).all_reduce_tensor(t)
    }
    fn broadcast_tensor(&self, t: &Tensor, root: usize) -> Result<()> {
        (**self).broadcast_tensor(t, root)
    }
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
    fn all_reduce_tensor(&self, _t: &mut Tensor) -> Result<()> {
        Ok(())
    }
    fn broadcast_tensor(&self, _t: &Tensor, _root: usize) -> Result<()> {
        Ok(())
    }
}
