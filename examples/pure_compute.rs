//! The pure compute of both runs of one configuration, timed in this one process: every
//! optimizer step's forward, backward and step, of the accumulation run and of each DDP
//! rank's share (collectives replaced by nothing), one libtorch thread as ddp-verify uses.
//! Set-up (data, model, sampling plan) is left out. bench/compare.py divides ddp-verify's
//! end-to-end time by this to get its overhead.
//!
//!   cargo run -q --example pure_compute -- '<TrainConfig as JSON>'

use std::time::Instant;

use ddp_verify::dist::Idle;
use ddp_verify::train::{accumulation_run, ddp_run, DdpStart, Run};
use ddp_verify::{Result, TrainConfig};

fn steps(mut run: Run) -> Result<f64> {
    let start = Instant::now();
    for s in 0..run.steps() {
        run.step(s)?;
    }
    Ok(start.elapsed().as_secs_f64())
}

fn main() -> anyhow::Result<()> {
    let json = std::env::args().nth(1).ok_or_else(|| anyhow::anyhow!("usage: pure_compute '<TrainConfig JSON>'"))?;
    let cfg: TrainConfig = serde_json::from_str(&json)?;
    ddp_verify::plan::checks::check_train(&cfg)?;
    tch::set_num_threads(1);
    let accumulation = steps(accumulation_run(&cfg)?)?;
    let mut ranks = Vec::new();
    for rank in 0..cfg.shape.gpus {
        ranks.push(steps(ddp_run(&cfg, &Idle { rank, world: cfg.shape.gpus }, DdpStart::Broadcast)?)?);
    }
    let ddp: f64 = ranks.iter().sum();
    println!(
        "{}",
        serde_json::json!({ "accumulation_s": accumulation, "ddp_ranks_s": ranks, "total_s": accumulation + ddp })
    );
    Ok(())
}
