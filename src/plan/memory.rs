//! This machine's memory, as the checks of what fits probe it: `split`'s index lists here,
//! the ranks' models and data in `train::fits`.

use crate::error::{Error, Result};
use crate::spec::TrainConfig;

/// `split` holds the index lists of one epoch in one process, and with `--json` their text:
/// refuse sizes this machine cannot hold (a billion samples is about 50 GiB).
pub fn check_split_fits(cfg: &TrainConfig, available: impl FnOnce() -> Option<f64>) -> Result<()> {
    let bytes = cfg.shape.data_size as f64 * (8.0 * 4.0 + 2.0 * 24.0);
    let Some(available) = too_much(bytes, available) else { return Ok(()) };
    Err(Error::bad_flag(
        "--data-size",
        format!(
            "listing {} samples takes about {:.1} GiB, but only {:.1} GiB is available",
            cfg.shape.data_size,
            gib(bytes),
            gib(available)
        ),
        "use a smaller --data-size",
    ))
}

/// The bytes available, when `bytes` would take more than 80% of them (an unknown amount
/// refuses nothing).
pub(crate) fn too_much(bytes: f64, available: impl FnOnce() -> Option<f64>) -> Option<f64> {
    let available = available().unwrap_or(f64::INFINITY);
    (bytes > 0.8 * available).then_some(available)
}

pub(crate) fn gib(bytes: f64) -> f64 {
    bytes / (1u64 << 30) as f64
}

/// MemAvailable from /proc/meminfo, in bytes: this machine's probe for the checks of what fits.
pub fn available_bytes() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: f64 = (1u64 << 30) as f64;

    fn machine(gib: f64) -> impl FnOnce() -> Option<f64> {
        move || Some(gib * GIB)
    }

    #[test]
    fn split_refuses_what_the_machine_cannot_list() {
        let mut cfg = TrainConfig::article();
        cfg.shape.data_size = 1 << 30;
        assert!(check_split_fits(&cfg, machine(1.0)).unwrap_err().to_string().starts_with("--data-size: "));
        assert!(check_split_fits(&cfg, machine(1024.0)).is_ok());
    }
}
