//! Training data exactly as PyTorch makes it: `torch.manual_seed(seed); torch.rand(N, D)`.
//! tch drives the same libtorch CPU generator, so the numbers are bit-identical.

use tch::{Device, Kind, Tensor};

pub fn linear_data(seed: u64, data_size: usize, features: usize) -> Tensor {
    tch::manual_seed(seed as i64);
    Tensor::rand([data_size as i64, features as i64], (Kind::Float, Device::Cpu))
}

/// The rows of one micro-batch, as `DataLoader`'s default collate stacks them.
pub fn gather(data: &Tensor, indices: &[i64]) -> Tensor {
    data.index_select(0, &Tensor::from_slice(indices))
}
