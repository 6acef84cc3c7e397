//! Step count and cadence: how many optimizer steps each run made, of how many backward
//! passes (the recorder's `micro.<s>`), and a gradient that outlived its step.

use super::evidence::flat;
use super::factor::close;
use super::{Diagnosis, Evidence};
use crate::evidence::Trace;
use crate::judge::Reason;

/// An engine that accumulates itself (DeepSpeed's gradient_accumulation_steps) told to
/// expect fewer backward passes per step than the loop made: every backward it took for a
/// boundary reduced and restarted the gradients, so only the last micro-batches' survived
/// (open-instruct PR 1498: manual accumulation over engine.backward with GAS=1). Not where
/// the boundaries were marked by hand (`set_gradient_accumulation_boundary`): several
/// backwards per step are then the engine's documented use, and what it lost is its own,
/// which the stage walk judges.
pub fn engine_boundary(ev: &Evidence) -> Option<Diagnosis> {
    [(ev.left(), ev.a), (ev.right(), ev.b)].into_iter().find_map(|(label, t)| {
        if t.header.boundary_by.is_some() {
            return None;
        }
        let gas = t.header.engine_accumulation?;
        let mut micro = t.facts.micro.clone();
        micro.sort_unstable();
        let m = usize::try_from(*micro.get(micro.len() / 2)?).ok()?;
        let every = match gas {
            1 => "every backward".to_string(),
            n => format!("every {n}th backward"),
        };
        (m > gas).then(|| Diagnosis {
            reason: Reason::EngineBoundary,
            located: None,
            detail: format!(
                "{label} ran {m} backward passes per optimizer step per rank under DeepSpeed's \
                     gradient_accumulation_steps={gas}: engine.backward takes {every} for an \
                     accumulation boundary, where it reduces and restarts the gradients, so the earlier micro-batches \
                     of each step are lost (stage 3 keeps them, undivided); set gradient_accumulation_steps to the \
                     micro-batches per step and call engine.step() after every engine.backward (it steps only at \
                     the boundary)"
            ),
        })
    })
}

/// Different numbers of optimizer steps, named by what the recorder counted: a run that
/// steps every micro-batch, or at another cadence, else different numbers of micro-batches.
pub fn step_count(ev: &Evidence) -> Option<Diagnosis> {
    let c = ev.c;
    if c.left_steps == c.right_steps {
        return None;
    }
    let typical = |t: &Trace| {
        let mut m: Vec<i64> = t.facts.micro.clone();
        m.sort_unstable();
        m.get(m.len() / 2).copied()
    };
    let k = ev.a.header.acc_steps.or(ev.b.header.acc_steps);
    let (l, r) = (ev.left(), ev.right());
    let (ls, rs) = (c.left_steps, c.right_steps);
    let detail = match (typical(ev.a), typical(ev.b)) {
        (Some(1), Some(k)) | (Some(k), Some(1)) if k > 1 => {
            let ((one, n), (other, m)) = if typical(ev.a) == Some(1) { ((l, ls), (r, rs)) } else { ((r, rs), (l, ls)) };
            format!(
                "{one} steps the optimizer after every micro-batch ({n} steps, 1 backward each) where {other} \
                 steps after {k} ({m} steps): one run does not accumulate; call optimizer.step() and zero_grad() \
                 once per K micro-batches (K/W per rank under DDP)"
            )
        }
        (Some(1), Some(1)) if k.is_some_and(|k| k > 1) => format!(
            "{l} made {ls} optimizer steps and {r} made {rs}, each after a single backward though K={}: neither run \
             accumulates; call optimizer.step() and zero_grad() once per K micro-batches (K/W per rank under DDP)",
            k.unwrap_or(1)
        ),
        (Some(x), Some(y)) if x != y => format!(
            "{l} made {ls} optimizer steps of {x} backward passes each and {r} made {rs} of {y}: the runs step at \
             different cadences; the accumulation condition must step once per K micro-batches in total \
             ((i + 1) % K == 0, K/W per rank), not e.g. i % (K - 1) == 0"
        ),
        _ => format!(
            "{l} made {ls} optimizer steps and {r} made {rs}: the samplers give different numbers of micro-batches"
        ),
    };
    Diagnosis::new(Reason::StepCount, detail)
}

/// A run's gradient at step s is step s-1's plus the other run's step s: never zeroed.
/// Asked before any factor: it only starts after step 0, and for a model whose gradient does
/// not depend on the weights it can also look like a constant ratio.
pub fn stale(ev: &Evidence) -> Option<Diagnosis> {
    let s = ev.first.filter(|&s| s > 0)?;
    let (x, y) = ev.grads()?;
    for (side, own, other) in [(ev.right(), ev.b, x), (ev.left(), ev.a, y)] {
        let stale: Vec<f64> = flat(&own.steps[s - 1]).iter().zip(other).map(|(p, o)| p + o).collect();
        if close(&flat(&own.steps[s]), &stale, ev.cx.eps) {
            return Diagnosis::new(
                Reason::StaleGradients,
                format!(
                    "{side}'s gradient at step {s} is step {}'s plus this step's: gradients are not zeroed after \
                     optimizer.step()",
                    s - 1
                ),
            );
        }
    }
    None
}
