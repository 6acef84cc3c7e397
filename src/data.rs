//! Training data exactly as PyTorch makes it: `torch.manual_seed(seed); torch.rand(N, D)`.
//! tch drives the same libtorch CPU generator, so the numbers are bit-identical.

use std::sync::Mutex;

use tch::{Device, Kind, Tensor};

use crate::config::TrainConfig;
use crate::error::{Error, Result};

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

pub fn linear_data(seed: u64, data_size: usize, features: usize) -> Result<Tensor> {
    Ok(seeded(seed, || Tensor::f_rand([data_size as i64, features as i64], (Kind::Float, Device::Cpu)))?)
}

/// Every process (the launcher and each rank) holds the whole data set: refuse, before
/// anything starts, a size this machine cannot hold rather than fail inside libtorch.
pub fn check_fits(cfg: &TrainConfig) -> Result<()> {
    let bytes = (cfg.data_size as f64) * (cfg.features as f64) * 4.0;
    let processes = (cfg.gpus + 1) as f64;
    let available = available_bytes().unwrap_or(f64::INFINITY);
    if bytes * processes > 0.8 * available {
        let gib = |b: f64| b / (1u64 << 30) as f64;
        return Err(Error::bad_flag(
            "--data-size",
            format!(
                "{} x --features {} is {:.1} GiB of data in each of {} processes, but only {:.1} GiB is available",
                cfg.data_size,
                cfg.features,
                gib(bytes),
                cfg.gpus + 1,
                gib(available)
            ),
            "use a smaller --data-size or --features",
        ));
    }
    Ok(())
}

/// MemAvailable from /proc/meminfo, in bytes.
fn available_bytes() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024.0)
}

/// The rows of one micro-batch, as `DataLoader`'s default collate stacks them.
pub fn gather(data: &Tensor, indices: &[i64]) -> Tensor {
    data.index_select(0, &Tensor::from_slice(indices))
}
