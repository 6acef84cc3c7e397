//! Precision apart: the legs ran a stage at other precisions (autocast on in one leg only or
//! in another dtype, the weights cast to another dtype in one). A recorded fact, so it
//! decides, however small the numeric difference: a run computed at another precision is
//! another training, whatever W.

use crate::judge::diagnose::parting::{Numbers, Parting};
use crate::judge::diagnose::{Evidence, Stage};

pub fn apart(ev: &Evidence) -> Option<Parting> {
    let (ha, hb) = (&ev.a.header, &ev.b.header);
    // Only where both traces say how they ran (a recorder that knows autocast says it).
    let known = |h: &crate::evidence::TraceHeader| h.versions.is_some() || h.torch_version.is_some();
    if !known(ha) || !known(hb) {
        return None;
    }
    // The forward and backward's precision: autocast's, else an engine's compute dtype
    // (FSDP2's MixedPrecisionPolicy casts the weights where one process autocasts), else the
    // weights' own.
    let compute = |h: &crate::evidence::TraceHeader| match (h.autocast, h.compute_dtype) {
        (Some(d), _) => Some((d, "autocast")),
        (None, Some(d)) => Some((d, "the engine's compute dtype")),
        (None, None) => h.dtype.map(|d| (d, "the weights")),
    };
    let (ca, cb) = (compute(ha)?, compute(hb)?);
    let (what, left, right) = if ca.0 != cb.0 {
        ("the forward and backward ran in", ca, cb)
    } else if let Some((x, y)) = ha.dtype.zip(hb.dtype).filter(|(x, y)| x != y) {
        ("the weights' dtype", (x, "the weights"), (y, "the weights"))
    } else {
        return None;
    };
    let step = ev.first.or(Some(0));
    Some(Parting::new(step, Some(Stage::Precision), None, Numbers::PrecisionApart { what, left, right }))
}

/// A rank that ran its forwards under another autocast than the first rank, at the step
/// judged (`ev.first`) of the right leg: each micro-batch's autocast as the recorder saw it.
/// Ranks at other precisions are another training whatever their numbers, in one run as in
/// two (`watch`'s precision contract).
pub fn ranks_apart(ev: &Evidence) -> Option<Parting> {
    let s = ev.first?;
    let step = ev.b.facts.stages.get(s)?;
    let mut seen = step.batches.iter().filter_map(|b| Some((b.rank, b.autocast?)));
    let first = seen.next()?;
    let (rank, digits) = seen.find(|(r, d)| *r != first.0 && *d != first.1)?;
    let numbers = Numbers::RanksPrecision { rank, digits, first };
    Some(Parting::new(Some(s), Some(Stage::Precision), Some(crate::judge::diagnose::parting::Side::Right), numbers))
}
