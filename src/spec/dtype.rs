//! The precisions both runs may compute in, and every float fact about them, once: a new
//! dtype touches this file only.

use serde::{Deserialize, Serialize};

/// The precision both runs compute in: data, weights, gradients and optimizer state alike
/// (`model.to(dtype)`, not autocast).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    #[default]
    Float32,
    Float64,
    Bfloat16,
    Float16,
}

impl Dtype {
    pub const ALL: [Dtype; 4] = [Dtype::Float32, Dtype::Float64, Dtype::Bfloat16, Dtype::Float16];

    pub fn name(self) -> &'static str {
        match self {
            Dtype::Float32 => "float32",
            Dtype::Float64 => "float64",
            Dtype::Bfloat16 => "bfloat16",
            Dtype::Float16 => "float16",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Dtype::ALL.into_iter().find(|d| d.name() == s)
    }

    pub fn kind(self) -> tch::Kind {
        match self {
            Dtype::Float32 => tch::Kind::Float,
            Dtype::Float64 => tch::Kind::Double,
            Dtype::Bfloat16 => tch::Kind::BFloat16,
            Dtype::Float16 => tch::Kind::Half,
        }
    }

    /// The dtype of a libtorch tensor kind, where it is one of these.
    pub fn of_kind(kind: tch::Kind) -> Option<Dtype> {
        Dtype::ALL.into_iter().find(|d| d.kind() == kind)
    }

    /// Significant bits, the implicit one included: 24, 53, 8, 11.
    pub fn digits(self) -> i32 {
        match self {
            Dtype::Float32 => 24,
            Dtype::Float64 => 53,
            Dtype::Bfloat16 => 8,
            Dtype::Float16 => 11,
        }
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
            assert_eq!(Dtype::of_kind(d.kind()), Some(d));
            assert_eq!(d.unit_roundoff(), d.epsilon() / 2.0);
        }
        assert_eq!(Dtype::of_kind(tch::Kind::Int64), None);
    }
}
