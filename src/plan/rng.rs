//! Seeded draws from libtorch's global generator, as `torch.manual_seed(seed)` then a draw:
//! the sampler's shuffle and the training data both come from here.

use std::sync::Mutex;

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
