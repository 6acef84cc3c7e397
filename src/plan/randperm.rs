//! `torch.randperm(n, generator=g)` after `g.manual_seed(seed)`, on the CPU, without
//! libtorch: ATen's mt19937 and its Fisher-Yates for n below 2^32 / 20 (`randperm_cpu`),
//! `z = random() % (n - i)`, swap `r[i]` and `r[i + z]`. The sampler's shuffle needs it
//! in the build without libtorch; a test holds it equal to libtorch's.

/// ATen's `at::mt19937`, seeded with the low 32 bits of the seed, as `manual_seed` does.
struct Mt19937 {
    state: [u32; 624],
    next: usize,
}

impl Mt19937 {
    fn new(seed: u64) -> Self {
        let mut state = [0u32; 624];
        state[0] = seed as u32;
        for j in 1..624 {
            let prev = state[j - 1];
            state[j] = 1_812_433_253u32.wrapping_mul(prev ^ (prev >> 30)).wrapping_add(j as u32);
        }
        Mt19937 { state, next: 624 }
    }

    fn random(&mut self) -> u32 {
        if self.next >= 624 {
            for k in 0..624 {
                let y = (self.state[k] & 0x8000_0000) | (self.state[(k + 1) % 624] & 0x7fff_ffff);
                let odd = if y & 1 == 1 { 0x9908_b0df } else { 0 };
                self.state[k] = self.state[(k + 397) % 624] ^ (y >> 1) ^ odd;
            }
            self.next = 0;
        }
        let mut y = self.state[self.next];
        self.next += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }
}

/// The permutation of 0..n torch draws from a generator seeded with `seed`.
pub fn randperm(n: usize, seed: u64) -> Vec<i64> {
    assert!(n < (u32::MAX / 20) as usize, "torch draws larger permutations another way");
    let mut g = Mt19937::new(seed);
    let mut r: Vec<i64> = (0..n as i64).collect();
    for i in 0..n.saturating_sub(1) {
        let z = g.random() as usize % (n - i);
        r.swap(i, i + z);
    }
    r
}

#[cfg(test)]
mod tests {

    /// The reference generator's first output for seed 5489 (C++'s std::mt19937 default).
    #[test]
    fn the_generator_is_mt19937() {
        assert_eq!(super::Mt19937::new(5489).random(), 3_499_211_612);
    }

    #[cfg(feature = "libtorch")]
    #[test]
    fn permutations_are_libtorchs() {
        for seed in [0u64, 1, 42, (1 << 32) + 5, 123_456_789] {
            for n in [0usize, 1, 2, 3, 10, 17, 100, 1000, 5000] {
                let torch = crate::plan::rng::seeded(seed, || {
                    tch::Tensor::randperm(n as i64, (tch::Kind::Int64, tch::Device::Cpu))
                });
                assert_eq!(super::randperm(n, seed), Vec::<i64>::try_from(&torch).unwrap(), "seed {seed}, n {n}");
            }
        }
    }
}
