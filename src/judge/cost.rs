//! The price of synchronising (seed 002, "the dreaded drop in speed"): what a multi-process
//! run's gradient collectives cost per optimizer step, from what was recorded (the
//! micro-batches whose gradients were reduced, the collectives and their bytes, the wall
//! seconds of each step), and the caution for a loop that reduces every micro-batch's
//! gradients where only the last one's need be.

use serde::Serialize;

use super::{Numbers, Parting};
use crate::evidence::{Engine, Trace};

/// One run's synchronisation and speed per optimizer step (medians over its steps).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LegCost {
    pub label: String,
    /// DDP, FSDP2, DeepSpeed: what reduced the gradients (None for one process).
    pub engine: Option<&'static str>,
    /// Micro-batches (backward passes) per step on each rank, and how many of them had
    /// their gradients reduced.
    pub micro_batches: Option<usize>,
    pub reduced: Option<usize>,
    /// Gradient collectives and megabytes one rank sent into them per step.
    pub collectives: Option<f64>,
    pub megabytes: Option<f64>,
    /// Wall seconds per step (steps after the first).
    pub seconds: Option<f64>,
}

/// Megabytes in words, in the unit that keeps them readable: 32 bytes, 4.2 kB, 224.3 MB.
pub fn size_words(mb: f64) -> String {
    match mb * 1e6 {
        b if b < 1e3 => format!("{b:.0} bytes"),
        b if b < 1e6 => format!("{:.1} kB", b / 1e3),
        b if b < 1e9 => format!("{:.1} MB", b / 1e6),
        b => format!("{:.2} GB", b / 1e9),
    }
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.retain(|x| x.is_finite());
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

impl LegCost {
    /// What `t` recorded of its cost; None where it recorded none of it.
    pub fn of(label: &str, t: &Trace) -> Option<LegCost> {
        let f = &t.facts;
        let flags = f.ddp_sync.iter().filter(|s| !s.is_empty());
        let reduced = median(flags.clone().map(|s| s.iter().filter(|&&x| x).count() as f64).collect());
        let micro = median(flags.map(|s| s.len() as f64).collect())
            .or_else(|| median(f.micro.iter().map(|&m| m as f64).collect()));
        let comm: Vec<(i64, i64)> = f.comm.iter().flatten().copied().collect();
        let cost = LegCost {
            label: label.to_string(),
            engine: t.header.engine.map(Engine::name),
            micro_batches: micro.map(|m| m as usize),
            // One process reduces nothing, whatever its DDP wrapper recorded.
            reduced: reduced.filter(|_| !one_process(t)).map(|r| r as usize),
            collectives: median(comm.iter().map(|c| c.0 as f64).collect()),
            megabytes: median(comm.iter().map(|c| c.1 as f64 / 1e6).collect()),
            seconds: median(f.seconds.iter().flatten().copied().collect()),
        };
        (cost.seconds.is_some() || cost.collectives.is_some()).then_some(cost)
    }

    /// In words, for the report's header lines.
    pub fn words(&self) -> String {
        let mut parts = Vec::new();
        match (self.reduced, self.micro_batches) {
            (Some(r), Some(m)) => parts.push(format!("{r} of {m} micro-batches per rank reduced")),
            (None, Some(m)) => parts.push(format!("{m} micro-batches")),
            _ => {}
        }
        if let (Some(c), Some(mb)) = (self.collectives, self.megabytes) {
            parts.push(format!("{c} gradient collectives, {} per rank", size_words(mb)));
        }
        if let Some(s) = self.seconds {
            parts.push(format!("{s:.4} s"));
        }
        let by = self.engine.map(|e| format!(" ({e})")).unwrap_or_default();
        format!("{}{by}: {} per optimizer step", self.label, parts.join(", "))
    }
}

/// A run of one process: its world size says so, else its kind (not DDP's).
fn one_process(t: &Trace) -> bool {
    t.header.world_size.map_or(t.header.run != Some(crate::evidence::RunKind::Ddp), |w| w <= 1)
}

/// Both runs' costs, where recorded.
pub fn costs(labels: [&str; 2], a: &Trace, b: &Trace) -> Vec<LegCost> {
    [LegCost::of(labels[0], a), LegCost::of(labels[1], b)].into_iter().flatten().collect()
}

/// An engine a loop can tell to skip a micro-batch's reduction: DDP and FSDP2. DeepSpeed
/// ZeRO 2 and 3 reduce inside every backward by design (their gradients are partitioned).
fn skippable(engine: Option<&str>) -> bool {
    matches!(engine, Some("ddp") | Some("fsdp2"))
}

/// The caution beside an equivalent verdict: a multi-process run that reduced more than one
/// micro-batch's gradients per step, where one reduction after the last would give the
/// same gradients (seed 002).
pub fn needless_sync(costs: &[LegCost]) -> Option<Parting> {
    let leg = costs.iter().find(|c| skippable(c.engine) && c.reduced.is_some_and(|r| r > 1))?;
    let (r, m) = (leg.reduced?, leg.micro_batches?);
    let needless = r - 1;
    let numbers = Numbers::NeedlessSync {
        label: leg.label.to_string(),
        needless,
        micro_batches: m,
        megabytes: leg.megabytes.map(|mb| mb * needless as f64 / r as f64),
        times: costs.iter().filter_map(|c| Some((c.label.to_string(), c.seconds?))).collect(),
    };
    Some(Parting::new(None, None, None, numbers))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evidence::{RunKind, TraceHeader};

    fn leg(run: RunKind, world_size: Option<usize>) -> Trace {
        let mut t =
            Trace { header: TraceHeader { run: Some(run), world_size, ..TraceHeader::default() }, ..Trace::default() };
        t.facts.ddp_sync = vec![vec![true; 4]; 2];
        t.facts.seconds = vec![Some(0.5); 2];
        t
    }

    /// A DDP wrapper at world 1 records each backward's flag, and nothing was reduced.
    #[test]
    fn one_process_reduces_nothing_whatever_its_wrapper_recorded() {
        let one = LegCost::of("accumulation", &leg(RunKind::Accumulation, Some(1))).unwrap();
        assert_eq!((one.micro_batches, one.reduced), (Some(4), None));
        assert!(one.words().starts_with("accumulation: 4 micro-batches, "), "{}", one.words());
        let ddp = LegCost::of("ddp", &leg(RunKind::Ddp, Some(2))).unwrap();
        assert_eq!(ddp.reduced, Some(4));
        assert_eq!(LegCost::of("ddp", &leg(RunKind::Ddp, None)).unwrap().reduced, Some(4));
    }
}
