//! The precisions both runs may compute in, and every float fact about them, once. Their
//! libtorch kinds are the library's (`spec::TchKind`).

values! {
    /// The precision both runs compute in: data, weights, gradients and optimizer state alike
    /// (`model.to(dtype)`, not autocast).
    #[derive(Default)]
    pub enum Dtype {
        #[default]
        Float32 = "float32",
        Float64 = "float64",
        Bfloat16 = "bfloat16",
        Float16 = "float16",
    }
}

impl Dtype {
    /// Significant bits, the implicit one included: 24, 53, 8, 11.
    pub fn digits(self) -> i32 {
        match self {
            Dtype::Float32 => 24,
            Dtype::Float64 => 53,
            Dtype::Bfloat16 => 8,
            Dtype::Float16 => 11,
        }
    }

    /// The dtype of `digits` significand digits, where one has them.
    pub fn of_digits(digits: u32) -> Option<Dtype> {
        [Dtype::Float32, Dtype::Float64, Dtype::Bfloat16, Dtype::Float16]
            .into_iter()
            .find(|d| d.digits() == digits as i32)
    }

    /// The exponent of the smallest normal value (2^min_exp); below it values are subnormal.
    pub fn min_exp(self) -> i32 {
        match self {
            Dtype::Float32 | Dtype::Bfloat16 => -126,
            Dtype::Float64 => -1022,
            Dtype::Float16 => -14,
        }
    }

    /// Machine epsilon, the spacing of values just above 1.
    pub fn epsilon(self) -> f64 {
        2f64.powi(1 - self.digits())
    }

    /// u, the largest relative error of one rounding to nearest: half of epsilon.
    pub fn unit_roundoff(self) -> f64 {
        2f64.powi(-self.digits())
    }

    /// The smallest positive value: where values are that small, rounding is absolute.
    pub fn smallest_subnormal(self) -> f64 {
        2f64.powi(self.min_exp() - (self.digits() - 1))
    }

    /// bfloat16 and float16, which libtorch widens to float32 to add and reduce.
    pub fn is_narrow(self) -> bool {
        matches!(self, Dtype::Bfloat16 | Dtype::Float16)
    }
}

values! {
    /// `--amp`: the autocast dtype; weights, gradients and optimizer state stay float32.
    pub enum Amp {
        /// matrix products and convolutions in bfloat16
        Bfloat16 = "bfloat16",
        /// matrix products and convolutions in float16, with a GradScaler
        Float16 = "float16",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table against Rust's own float32 and float64, and the IEEE formats of the others.
    #[test]
    fn the_float_facts_are_the_formats_own() {
        assert_eq!(Dtype::Float32.epsilon(), f32::EPSILON as f64);
        assert_eq!(Dtype::Float64.epsilon(), f64::EPSILON);
        assert_eq!(Dtype::Float32.smallest_subnormal(), f32::from_bits(1) as f64);
        assert_eq!(Dtype::Float64.smallest_subnormal(), f64::from_bits(1));
        assert_eq!(Dtype::Float16.smallest_subnormal(), 2f64.powi(-24));
        assert_eq!(Dtype::Bfloat16.epsilon(), 2f64.powi(-7));
        assert_eq!(Dtype::Float16.unit_roundoff(), 2f64.powi(-11));
        for d in Dtype::ALL {
            assert_eq!(d.unit_roundoff(), d.epsilon() / 2.0);
        }
    }
}
