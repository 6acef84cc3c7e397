//! Every DDP rank must hold the same model after every step. Each rank hashes what it holds
//! (parameters, the synchronised gradients, the optimizer's state), the ranks all-reduce a
//! table with one row per rank, and every rank learns the first (rank, tensor) that differs
//! from rank 0's. A parameter left out of the all-reduce shows here at the step it happens,
//! named, before it has drifted far enough to show anywhere else.
//!
//! BatchNorm's running statistics are not compared: between DDP's buffer broadcasts each
//! rank updates them with its own micro-batches, so they differ by design.

use tch::{Device, Tensor};

use super::Collective;
use crate::error::Result;
use crate::evidence::{RankDrift, RankHeld};

/// 48 bits of a hash of the tensor's bytes (`None`: an undefined gradient), exact in the
/// float64 table the ranks sum. Ranks that computed the same bits hash alike.
fn hash48(t: &Tensor) -> Result<f64> {
    if !t.defined() {
        return Ok(0.0);
    }
    let t = t.detach().to_device(Device::Cpu).contiguous();
    let n = t.numel() * t.kind().elt_size_in_bytes();
    let mut bytes = vec![0u8; n];
    t.f_copy_data_u8(&mut bytes, t.numel())?;
    // FNV-style over 8-byte words, then a final mix: fast, and any flipped bit changes it.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ n as u64;
    let mut words = bytes.chunks_exact(8);
    for w in &mut words {
        h = (h ^ u64::from_le_bytes(w.try_into().expect("8 bytes"))).wrapping_mul(0x0000_0100_0000_01b3);
        h ^= h >> 29;
    }
    for &b in words.remainder() {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 31;
    h = h.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    // 1 + ... : never 0, which stands for "no tensor".
    Ok((1 + (h >> 16) % ((1u64 << 48) - 1)) as f64)
}

/// Every rank calls this after step `step` with its named tensors in the same order. Ranks
/// first agree on how many each holds: a rank whose optimizer never stepped (its loss scaler
/// skipped where the others' did not) holds no optimizer state yet, and a table of another
/// size would not line up.
pub fn compare_ranks(comm: &dyn Collective, step: usize, named: &[(RankHeld, Tensor)]) -> Result<Option<RankDrift>> {
    let (w, n, r) = (comm.world_size(), named.len(), comm.rank());
    if w < 2 {
        return Ok(None);
    }
    let mut counts = vec![0.0; w];
    counts[r] = n as f64;
    comm.all_reduce_sum_f64(&mut counts)?;
    if let Some(rank) = (1..w).find(|&q| counts[q] != counts[0]) {
        let tensor = RankHeld::TensorCount { theirs: counts[rank] as usize, rank0: counts[0] as usize };
        return Ok(Some(RankDrift { step, rank, tensor }));
    }
    if n == 0 {
        return Ok(None);
    }
    let mut table = vec![0.0; w * n];
    for (i, (_, t)) in named.iter().enumerate() {
        table[r * n + i] = hash48(t)?;
    }
    comm.all_reduce_sum_f64(&mut table)?;
    let drift = (1..w).find_map(|rank| {
        (0..n).find(|&i| table[rank * n + i] != table[i]).map(|i| RankDrift { step, rank, tensor: named[i].0.clone() })
    });
    Ok(drift)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_flipped_bit_changes_the_hash_and_equal_bits_do_not() {
        let a = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0]);
        let b = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, f32::from_bits(5.0f32.to_bits() ^ 1)]);
        assert_eq!(hash48(&a).unwrap(), hash48(&a.copy()).unwrap());
        assert_ne!(hash48(&a).unwrap(), hash48(&b).unwrap());
        assert!(hash48(&a).unwrap() < (1u64 << 48) as f64 && hash48(&a).unwrap() > 0.0);
    }
}
