//! tiny-lm's dropout masks are keyed by what a sample is, not where it runs: the seed, the
//! epoch that drew it, its index in the data set and the layer's site. DDP ranks, the
//! accumulation run and the big batch then draw the same mask for the same sample, so
//! dropout is equivalent by construction. PyTorch rebuilds each row with
//! `torch.rand((T, D), generator=torch.Generator().manual_seed(key))`, keeping `u >= p`
//! and dividing by `1 - p` (`fixtures/lm_reference.py`).

/// `(((seed·1000003 + epoch)·1000003 + index)·1000003 + site) mod 2^63`, in wrapping u64
/// arithmetic (which is the same modulo 2^64, hence modulo 2^63).
pub fn key(seed: u64, epoch: u64, index: i64, site: usize) -> u64 {
    const M: u64 = 1_000_003;
    let k = seed.wrapping_mul(M).wrapping_add(epoch);
    let k = k.wrapping_mul(M).wrapping_add(index as u64);
    k.wrapping_mul(M).wrapping_add(site as u64) & (u64::MAX >> 1)
}

/// What a step's masks were drawn from, in one number the ranks can sum exactly: each key's
/// low 32 bits, added (at most 2^21 keys a step stay exact in float64).
pub fn digest(keys: impl IntoIterator<Item = u64>) -> f64 {
    keys.into_iter().map(|k| (k & 0xffff_ffff) as f64).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Python's `(((s * 1000003 + e) * 1000003 + i) * 1000003 + l) % 2**63` on big ints.
    #[test]
    fn keys_are_pythons_modular_formula() {
        assert_eq!(key(0, 0, 0, 0), 0);
        assert_eq!(key(0, 0, 1, 0), 1_000_003);
        assert_eq!(key(1, 2, 3, 1), ((1_000_003u128 + 2) * 1_000_003 + 3) as u64 * 1_000_003 + 1);
        // Past 2^63: computed with u128 and reduced.
        let big = |s: u128, e: u128, i: u128, l: u128| {
            let m = 1_000_003u128;
            ((((s * m + e) * m + i) * m + l) % (1u128 << 63)) as u64
        };
        assert_eq!(key(u32::MAX as u64, 7, 123_456, 3), big(u32::MAX as u128, 7, 123_456, 3));
    }
}
