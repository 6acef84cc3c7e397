//! Training data exactly as PyTorch makes it: `torch.manual_seed(seed); torch.rand(N, D)`.
//! tch drives the same libtorch CPU generator, so the numbers are bit-identical.

use std::sync::Mutex;

use tch::{Device, Kind, Tensor};

/// libtorch's default CPU generator is global and tch cannot make private ones, so every
/// seed-then-draw goes through this lock (tests run on parallel threads).
static GENERATOR: Mutex<()> = Mutex::new(());

/// Runs `draw` right after `torch.manual_seed(seed)`, with the generator to itself. The
/// global generator just seeded is in the same state as a fresh `torch.Generator` seeded so.
pub fn seeded<T>(seed: u64, draw: impl FnOnce() -> T) -> T {
    let _guard = GENERATOR.lock().unwrap_or_else(|e| e.into_inner());
    tch::manual_seed(seed as i64);
    draw()
}

pub fn linear_data(seed: u64, data_size: usize, features: usize) -> Tensor {
    seeded(seed, || Tensor::rand([data_size as i64, features as i64], (Kind::Float, Device::Cpu)))
}

/// The rows of one micro-batch, as `DataLoader`'s default collate stacks them.
pub fn gather(data: &Tensor, indices: &[i64]) -> Tensor {
    data.index_select(0, &Tensor::from_slice(indices))
}
