//! The two runs, driven by one loop that follows the seed article's:
//! the micro-batch counter restarts each epoch, and a partial window at an epoch's end keeps
//! its gradient for the next window, as PyTorch does with the same loop.

mod accumulation;
mod ddp;
pub mod launch;
pub mod pool;
mod supervise;

pub use accumulation::accumulation;
pub use ddp::ddp_rank;

use tch::Tensor;

use crate::config::TrainConfig;
use crate::data;
use crate::error::Result;
use crate::models::Model;
use crate::optim::Sgd;
use crate::trace::{snapshot, Trace};

/// DDP's gradient all-reduce, or nothing.
type Sync<'a> = &'a mut dyn FnMut(&[(String, Tensor)]) -> Result<()>;

/// How one run differs from the other; everything else is shared.
struct Schedule<'a> {
    /// The micro-batches this process runs in an epoch, in order.
    micro_batches: &'a dyn Fn(u64) -> Vec<Vec<i64>>,
    /// Micro-batches per optimizer step on this process (K, or K/W per rank).
    window: usize,
    /// Each micro-batch's loss is divided by this (K, or K/W per rank).
    loss_divisor: usize,
    /// False only to plant the stale-gradient bug.
    zero_grad: bool,
    /// Runs at each window's end before the step: DDP's gradient all-reduce.
    sync: Sync<'a>,
}

fn train(cfg: &TrainConfig, model: &dyn Model, data: &Tensor, s: Schedule) -> Result<Trace> {
    let params = model.parameters();
    let tensors: Vec<Tensor> = params.iter().map(|(_, t)| t.shallow_clone()).collect();
    let mut opt = Sgd::new(&tensors, cfg.lr, cfg.momentum)?;
    let mut trace = Trace::default();
    let abs = |p: &Tensor| p.detach().abs();
    let mut peaks: Vec<Tensor> = params.iter().map(|(_, p)| abs(p)).collect();
    opt.zero_grad()?;
    for epoch in 0..cfg.epochs as u64 {
        for (i, idx) in (s.micro_batches)(epoch).iter().enumerate() {
            let x = data::gather(data, idx);
            // `loss / ACC_STEPS` with an integer divisor, as in the article.
            let loss = model.loss(&x) / s.loss_divisor as f64;
            loss.backward();
            if (i + 1) % s.window == 0 {
                (s.sync)(params)?;
                trace.steps.push(snapshot(params.iter().map(|(n, p)| (n, p.grad()))));
                opt.step()?;
                for (peak, (_, p)) in peaks.iter_mut().zip(params) {
                    *peak = peak.maximum(&abs(p));
                }
                if s.zero_grad {
                    opt.zero_grad()?;
                }
            }
        }
    }
    trace.finals = snapshot(params.iter().map(|(n, p)| (n, p.shallow_clone())));
    trace.peaks = params.iter().map(|(n, _)| n.clone()).zip(peaks).collect();
    Ok(trace)
}
