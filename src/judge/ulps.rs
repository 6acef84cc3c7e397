//! Distances in units in the last place, in each dtype's own format.

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Precision {
    F32,
    F64,
    /// bfloat16 (8 significant bits, float32's exponents) or float16 (11 bits, normal down
    /// to 2^-14); their values are exact in float64, where they are counted.
    Narrow {
        digits: i32,
        min_exp: i32,
    },
    Int,
}

impl Precision {
    /// The spacing of values at |x|.
    pub(super) fn ulp(self, x: f64) -> f64 {
        match self {
            Precision::F32 => ulp(x as f32) as f64,
            Precision::Narrow { digits, min_exp } => 2f64.powi(binade(x).max(min_exp) - (digits - 1)),
            _ => {
                let x = x.abs();
                f64::from_bits(x.to_bits() + 1) - x
            }
        }
    }

    pub(super) fn ulps_between(self, a: f64, b: f64) -> u64 {
        match self {
            Precision::F32 => ulps_between(a as f32, b as f32),
            Precision::Narrow { digits, min_exp } => {
                // Index of |x| among the format's non-negative values: 2^(digits-1) per
                // binade above the lowest, plus its significand (subnormals continue below).
                let key = |x: f64| {
                    let e = binade(x).max(min_exp);
                    let significand = x.abs() / 2f64.powi(e - (digits - 1));
                    let k = ((e - min_exp) as f64 * 2f64.powi(digits - 1) + significand).round() as i64;
                    if x.is_sign_negative() {
                        -k
                    } else {
                        k
                    }
                };
                (key(a) - key(b)).unsigned_abs()
            }
            _ => {
                let key = |x: f64| {
                    let mag = (x.to_bits() & 0x7fff_ffff_ffff_ffff) as i128;
                    if x.is_sign_negative() {
                        -mag
                    } else {
                        mag
                    }
                };
                (key(a) - key(b)).unsigned_abs().min(u64::MAX as u128) as u64
            }
        }
    }
}

/// floor(log2 |x|) for a normal float64 (very negative for 0).
fn binade(x: f64) -> i32 {
    if x == 0.0 {
        return i32::MIN / 2;
    }
    ((x.abs().to_bits() >> 52) & 0x7ff) as i32 - 1023
}

/// The spacing of float32 values at |x|.
pub(super) fn ulp(x: f32) -> f32 {
    let x = x.abs();
    f32::from_bits(x.to_bits() + 1) - x
}

/// Distance in representable float32 values; +0 and -0 count as the same.
pub fn ulps_between(a: f32, b: f32) -> u64 {
    fn key(x: f32) -> i64 {
        let bits = x.to_bits();
        let mag = (bits & 0x7fff_ffff) as i64;
        if bits >> 31 == 1 {
            -mag
        } else {
            mag
        }
    }
    (key(a) - key(b)).unsigned_abs()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// bfloat16 is float32's top 16 bits, so its ulp distance is theirs, shifted.
    #[test]
    fn bfloat16_ulps_are_its_bit_distance() {
        let bf16 = Precision::Narrow { digits: 8, min_exp: -126 };
        let mut bits: u32 = 12345;
        for _ in 0..2000 {
            bits = bits.wrapping_mul(1_103_515_245).wrapping_add(12345);
            let (a, b) = ((bits >> 1) & 0x7f7f_0000, (bits.rotate_left(13) >> 1) & 0x7f7f_0000);
            let (x, y) = (f32::from_bits(a) as f64, f32::from_bits(b) as f64);
            assert_eq!(bf16.ulps_between(x, y), ((a >> 16) as i64 - (b >> 16) as i64).unsigned_abs(), "{x} {y}");
            assert_eq!(bf16.ulps_between(-x, y), ((a >> 16) as i64 + (b >> 16) as i64) as u64, "{x} {y}");
        }
    }

    #[test]
    fn float16_ulps_cross_binades_and_subnormals() {
        let f16 = Precision::Narrow { digits: 11, min_exp: -14 };
        assert_eq!(f16.ulps_between(1.0, 1.0 + 2f64.powi(-10)), 1);
        assert_eq!(f16.ulps_between(1.0, 1.0 - 2f64.powi(-11)), 1);
        assert_eq!(f16.ulps_between(0.0, 2f64.powi(-24)), 1); // the smallest subnormal
        assert_eq!(f16.ulps_between(2f64.powi(-14) - 2f64.powi(-24), 2f64.powi(-14)), 1);
        assert_eq!(f16.ulps_between(65504.0, 65504.0 - 32.0), 1); // the largest finite value
        assert_eq!(f16.ulp(1.0), 2f64.powi(-10));
        assert_eq!(f16.ulp(1e-7), 2f64.powi(-24));
    }

    #[test]
    fn ulps_counts_representable_steps() {
        assert_eq!(ulps_between(1.0, 1.0), 0);
        assert_eq!(ulps_between(1.0, f32::from_bits(1.0f32.to_bits() + 3)), 3);
        assert_eq!(ulps_between(0.0, -0.0), 0);
        assert_eq!(ulps_between(f32::from_bits(1), -f32::from_bits(1)), 2);
    }
}
