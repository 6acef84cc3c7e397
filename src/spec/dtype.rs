//! The libtorch side of the precisions `crates/cli` defines without libtorch.

use super::{Amp, Dtype};

/// A precision's libtorch tensor kind, both ways.
pub trait TchKind: Sized + Copy + 'static {
    const ALL_KINDS: &'static [Self];

    fn kind(self) -> tch::Kind;

    /// The value whose kind `kind` is, where it is one of these.
    fn of_kind(kind: tch::Kind) -> Option<Self> {
        Self::ALL_KINDS.iter().copied().find(|v| v.kind() == kind)
    }
}

impl TchKind for Dtype {
    const ALL_KINDS: &'static [Self] = &Dtype::ALL;

    fn kind(self) -> tch::Kind {
        match self {
            Dtype::Float32 => tch::Kind::Float,
            Dtype::Float64 => tch::Kind::Double,
            Dtype::Bfloat16 => tch::Kind::BFloat16,
            Dtype::Float16 => tch::Kind::Half,
        }
    }
}

impl TchKind for Amp {
    const ALL_KINDS: &'static [Self] = &Amp::ALL;

    fn kind(self) -> tch::Kind {
        match self {
            Amp::Bfloat16 => tch::Kind::BFloat16,
            Amp::Float16 => tch::Kind::Half,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_is_its_own_kinds() {
        for d in Dtype::ALL {
            assert_eq!(Dtype::of_kind(d.kind()), Some(d));
        }
        assert_eq!(Dtype::of_kind(tch::Kind::Int64), None);
    }
}
