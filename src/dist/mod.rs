//! Distribution: the collective engine behind DDP as one small trait (this file), the
//! world of MPI ranks (`world`), which devices there are (`device`), and which CPU kernels
//! compute (`kernels`).
//!
//! The collective engine behind DDP, as one small trait: Open MPI (rsmpi) for CPU ranks,
//! NCCL (cudarc) for GPU ranks. Slices carry the launcher's small control messages; tensors
//! carry gradients and state, and stay on the device where the backend can reach them.

pub mod device;
pub mod fingerprint;
pub mod kernels;
mod mpi;
mod nccl;
pub mod world;

pub use self::mpi::Mpi;
pub use self::nccl::Nccl;

use tch::{Device, Kind, Tensor};

use crate::error::{Error, Result};
use crate::spec::TchKind;

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
    /// reduces on the GPU, MPI in the tensor's own memory).
    fn all_reduce_tensor(&self, t: &mut Tensor) -> Result<()> {
        all_reduce_through_host(self, t)
    }

    /// Copies `root`'s tensor into every rank's tensor of the same shape and dtype.
    fn broadcast_tensor(&self, t: &Tensor, root: usize) -> Result<()> {
        broadcast_through_host(self, t, root)
    }
}

/// [`Collective::all_reduce_tensor`] through slices. bfloat16 and float16 are summed in
/// float32 and rounded once, which for two ranks is exactly gloo's and NCCL's rounded sum.
pub(crate) fn all_reduce_through_host<C: Collective + ?Sized>(comm: &C, t: &mut Tensor) -> Result<()> {
    let host = t.to_device(Device::Cpu).contiguous();
    let narrow = crate::spec::Dtype::of_kind(host.kind()).is_some_and(crate::spec::Dtype::is_narrow);
    let host = if narrow { host.to_kind(Kind::Float) } else { host };
    let summed = match host.kind() {
        Kind::Double => {
            let mut values = Vec::<f64>::try_from(&host.flatten(0, -1))?;
            comm.all_reduce_sum_f64(&mut values)?;
            Tensor::from_slice(&values)
        }
        Kind::Float => {
            let mut values = Vec::<f32>::try_from(&host.flatten(0, -1))?;
            comm.all_reduce_sum(&mut values)?;
            Tensor::from_slice(&values)
        }
        kind => {
            return Err(Error::Rank {
                rank: comm.rank(),
                problem: format!("all-reduce needs floating tensors, got {kind:?}"),
            })
        }
    };
    // copy_ rounds back to the tensor's own dtype.
    tch::no_grad(|| t.copy_(&summed.view_as(t)));
    Ok(())
}

/// [`Collective::broadcast_tensor`] through a byte buffer.
pub(crate) fn broadcast_through_host<C: Collective + ?Sized>(comm: &C, t: &Tensor, root: usize) -> Result<()> {
    if comm.world_size() == 1 {
        return Ok(());
    }
    let host = t.to_device(Device::Cpu).contiguous();
    let numel = host.numel();
    let mut bytes = vec![0u8; numel * host.kind().elt_size_in_bytes()];
    host.f_copy_data_u8(&mut bytes, numel)?;
    comm.broadcast_bytes(&mut bytes, root)?;
    let got = Tensor::f_from_data_size(&bytes, &t.size(), t.kind())?;
    tch::no_grad(|| t.shallow_clone().copy_(&got));
    Ok(())
}

/// The DDP reducer's average of every gradient: multiply by 1/W, then all-reduce SUM, in
/// buckets as DDP's reducer does (see [`broadcast_all`] for why not per tensor). Returns
/// the all-reduces made and the bytes they carried from this rank (the report's cost).
pub fn average_gradients(comm: &dyn Collective, grads: &[Tensor]) -> Result<(i64, i64)> {
    let scale = 1.0 / comm.world_size() as f64;
    let mut flats = flatten(grads)?;
    let mut bytes = 0i64;
    for flat in &mut flats {
        let _ = flat.g_mul_scalar_(scale);
        comm.all_reduce_tensor(flat)?;
        bytes += (flat.numel() * flat.kind().elt_size_in_bytes()) as i64;
    }
    unflatten(&flats, grads);
    Ok((flats.len() as i64, bytes))
}

/// Copies `root`'s tensors into every rank's, one collective per bucket. W processes share
/// the cores, so a rendezvous whose peer is descheduled waits a scheduler slice; one per
/// tensor cost resnet18 about 0.15 s a step.
pub fn broadcast_all(comm: &dyn Collective, ts: &[Tensor], root: usize) -> Result<()> {
    broadcast_into(comm, None, ts, root)
}

/// Every rank's `ts` become `flats` as root holds them ([`flatten`] of tensors shaped like
/// `ts`; root's own `ts` when None).
pub fn broadcast_into(comm: &dyn Collective, flats: Option<Vec<Tensor>>, ts: &[Tensor], root: usize) -> Result<()> {
    let root_has = comm.rank() == root && flats.is_none();
    if root_has && comm.world_size() == 1 {
        return Ok(());
    }
    let flats = match flats {
        Some(flats) => flats,
        None if comm.rank() == root => flatten(ts)?,
        None => buckets(ts).into_iter().map(|b| Tensor::empty([b.numel], (b.kind, comm.device()))).collect(),
    };
    for flat in &flats {
        comm.broadcast_tensor(flat, root)?;
    }
    if !root_has {
        unflatten(&flats, ts);
    }
    Ok(())
}

/// At most this many bytes per bucket, DDP's default `bucket_cap_mb`. It also keeps each
/// flat copy under 32 MiB, the most glibc's adaptive mmap threshold rises to, so buckets
/// come from reused heap memory instead of fresh, zero-filled pages every step.
const BUCKET_BYTES: usize = 25 * 1024 * 1024;

/// Flat copies of `ts`: one dtype per bucket, tensors in order, a bucket closed before it
/// would pass [`BUCKET_BYTES`] (a larger tensor gets a bucket of its own).
pub fn flatten(ts: &[Tensor]) -> Result<Vec<Tensor>> {
    buckets(ts)
        .into_iter()
        .map(|b| {
            let group: Vec<Tensor> = b.members.iter().map(|&i| ts[i].detach().reshape(-1)).collect();
            Ok(Tensor::f_cat(&group, 0)?)
        })
        .collect()
}

/// Copies [`flatten`]'s output back into tensors shaped like those it was made from.
pub fn unflatten(flats: &[Tensor], ts: &[Tensor]) {
    tch::no_grad(|| {
        for (b, flat) in buckets(ts).into_iter().zip(flats) {
            let mut at = 0;
            for &i in &b.members {
                let t = &ts[i];
                let n = t.numel() as i64;
                t.shallow_clone().copy_(&flat.narrow(0, at, n).view_as(t));
                at += n;
            }
        }
    });
}

/// Tensors that travel together in one flat buffer.
struct Bucket {
    kind: Kind,
    members: Vec<usize>,
    numel: i64,
}

fn buckets(ts: &[Tensor]) -> Vec<Bucket> {
    let mut out: Vec<Bucket> = Vec::new();
    // The open bucket of each dtype, by index into `out`.
    let mut open: Vec<(Kind, usize)> = Vec::new();
    for (i, t) in ts.iter().enumerate() {
        let (kind, n) = (t.kind(), t.numel() as i64);
        let size = |numel: i64| numel as usize * kind.elt_size_in_bytes();
        match open.iter().find(|(k, _)| *k == kind).map(|&(_, b)| b) {
            Some(b) if out[b].numel == 0 || size(out[b].numel + n) <= BUCKET_BYTES => {
                out[b].members.push(i);
                out[b].numel += n;
            }
            _ => {
                open.retain(|(k, _)| *k != kind);
                open.push((kind, out.len()));
                out.push(Bucket { kind, members: vec![i], numel: n });
            }
        }
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Mixed dtypes and sizes, one tensor over the cap: every bucket holds one dtype, stays
    /// under the cap unless it is a single tensor, and the round trip restores every value.
    #[test]
    fn buckets_round_trip_and_respect_the_cap() {
        let cap = BUCKET_BYTES as i64 / 4;
        // Through the generator's lock: a draw from another test's seeded sequence would
        // change that test's numbers (the sampler's shuffle, for one).
        let ts = crate::plan::rng::seeded(0, || {
            vec![
                Tensor::randn([cap / 2], (Kind::Float, Device::Cpu)),
                Tensor::arange(7, (Kind::Int64, Device::Cpu)),
                Tensor::randn([cap / 3, 2], (Kind::Float, Device::Cpu)),
                Tensor::randn([cap + 5], (Kind::Float, Device::Cpu)),
                Tensor::randn([3], (Kind::Float, Device::Cpu)),
                Tensor::arange(2, (Kind::Int64, Device::Cpu)),
            ]
        });
        let plan = buckets(&ts);
        for b in &plan {
            assert!(b.members.iter().all(|&i| ts[i].kind() == b.kind));
            let bytes = b.numel as usize * b.kind.elt_size_in_bytes();
            assert!(bytes <= BUCKET_BYTES || b.members.len() == 1, "{:?}", b.members);
        }
        let mut seen: Vec<usize> = plan.iter().flat_map(|b| b.members.clone()).collect();
        seen.sort();
        assert_eq!(seen, (0..ts.len()).collect::<Vec<_>>());

        let flats = flatten(&ts).unwrap();
        let copies: Vec<Tensor> = ts.iter().map(|t| t.zeros_like()).collect();
        unflatten(&flats, &copies);
        for (t, c) in ts.iter().zip(&copies) {
            assert!(t.equal(c));
        }
    }
}
