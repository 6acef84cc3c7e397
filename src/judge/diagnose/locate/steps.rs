//! Step count and cadence: how many optimizer steps each run made, of how many backward
//! passes (the recorder's `micro.<s>`), what a framework's optimizer wrapper was told to
//! accumulate, and a gradient that outlived its step.

use crate::evidence::Trace;
use crate::judge::diagnose::measure::factor::close;
use crate::judge::diagnose::measure::median;
use crate::judge::diagnose::owner::library_of;
use crate::judge::diagnose::parting::{Numbers, Parting, Side, Steps};
use crate::judge::diagnose::{evidence::flat, Evidence, Stage};

/// Different numbers of optimizer steps. Where a framework's optimizer wrapper was told to
/// accumulate more micro-batches than its optimizer stepped after (and counted the script's
/// step() calls), its step gating let them through; else named by what the recorder
/// counted: a run that steps every micro-batch, or at another cadence, else different
/// numbers of micro-batches.
pub fn step_count(ev: &Evidence) -> Option<Parting> {
    let c = ev.c;
    if c.left_steps == c.right_steps {
        return None;
    }
    if let Some(p) = stepped_early(ev) {
        return Some(p);
    }
    let typical = |t: &Trace| {
        let mut m: Vec<i64> = t.facts.micro.clone();
        m.sort_unstable();
        m.get(m.len() / 2).copied()
    };
    let k = ev.a.header.acc_steps.or(ev.b.header.acc_steps);
    let (ls, rs) = (c.left_steps, c.right_steps);
    let steps = match (typical(ev.a), typical(ev.b)) {
        (Some(1), Some(k)) | (Some(k), Some(1)) if k > 1 => {
            let ((one, n), (other, m)) = match typical(ev.a) == Some(1) {
                true => ((Side::Left, ls), (Side::Right, rs)),
                false => ((Side::Right, rs), (Side::Left, ls)),
            };
            Steps::EveryMicroBatch { one, n, other, m, k }
        }
        (Some(1), Some(1)) if k.is_some_and(|k| k > 1) => Steps::Neither { k: k.unwrap_or(1), left: ls, right: rs },
        (Some(x), Some(y)) if x != y => Steps::Cadences { left: (ls, x), right: (rs, y) },
        _ => Steps::Counts { left: ls, right: rs },
    };
    Some(Parting::new(None, Some(Stage::Update), None, Numbers::StepCount(steps)))
}

/// The runs started from other weights: the checksums of the weights as each run's first
/// forward found them differ. Before anything else of the structure: nothing after can agree.
pub fn other_start(ev: &Evidence) -> Option<Parting> {
    let (a, b) = (ev.a.header.start_weights.as_ref()?, ev.b.header.start_weights.as_ref()?);
    (a != b).then(|| Parting::new(Some(0), Some(Stage::Update), None, Numbers::OtherStart))
}

/// A framework's optimizer wrapper told to accumulate n micro-batches whose optimizer
/// stepped after fewer, the script's step() calls counted.
pub fn stepped_early(ev: &Evidence) -> Option<Parting> {
    ev.sides().into_iter().find_map(|(side, t)| {
        let told = t.header.framework_accumulation?;
        let micro = median(t.facts.micro.iter().map(|&m| m as f64).collect())?;
        let calls = median(t.facts.stages.iter().filter_map(|s| s.step_calls).map(|c| c as f64).collect())?;
        let wrapped = t.header.framework.and_then(library_of).is_some();
        (told as f64 > micro && wrapped).then(|| {
            let numbers = Numbers::SteppedEarly { micro: micro as i64, told, calls };
            Parting::new(None, Some(Stage::Update), Some(side), numbers)
        })
    })
}

/// An engine that accumulates itself (DeepSpeed's gradient_accumulation_steps) told to
/// expect fewer backward passes per step than the loop made: every backward it took for a
/// boundary reduced and restarted the gradients, so only the last micro-batches' survived
/// (open-instruct PR 1498: manual accumulation over engine.backward with GAS=1). Not where
/// the boundaries were marked by hand (`set_gradient_accumulation_boundary`): several
/// backwards per step are then the engine's documented use, and what it lost is its own,
/// which the stage walk judges.
pub fn engine_boundary(ev: &Evidence) -> Option<Parting> {
    ev.sides().into_iter().find_map(|(side, t)| {
        if t.header.boundary_by.is_some() {
            return None;
        }
        let gas = t.header.engine_accumulation?;
        let mut micro = t.facts.micro.clone();
        micro.sort_unstable();
        let per_step = usize::try_from(*micro.get(micro.len() / 2)?).ok()?;
        (per_step > gas).then(|| {
            let numbers = Numbers::EngineBoundary { per_step, gas };
            Parting::new(None, Some(Stage::Reduction), Some(side), numbers)
        })
    })
}

/// A run's gradient at step s is step s-1's plus the other run's step s: never zeroed.
/// Asked before any factor: it only starts after step 0, and for a model whose gradient does
/// not depend on the weights it can also look like a constant ratio.
pub fn stale(ev: &Evidence) -> Option<Parting> {
    let s = ev.first.filter(|&s| s > 0)?;
    let (x, y) = ev.grads()?;
    for (side, own, other) in [(Side::Right, ev.b, x), (Side::Left, ev.a, y)] {
        let stale: Vec<f64> = flat(&own.steps[s - 1]).iter().zip(other).map(|(p, o)| p + o).collect();
        if close(&flat(&own.steps[s]), &stale, ev.cx.eps) {
            return Some(Parting::new(Some(s), Some(Stage::LocalGradient), Some(side), Numbers::Stale));
        }
    }
    None
}
