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
