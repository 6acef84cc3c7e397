//! Precision apart: the legs ran a stage at other precisions (autocast on in one leg only or
//! in another dtype, the weights cast to another dtype in one). A recorded fact, so it
//! decides, however small the numeric difference: a run computed at another precision is
//! another training, whatever W.

use crate::judge::diagnose::parting::{Numbers, Parting};
use crate::judge::diagnose::{Evidence, Stage};
use crate::spec::Dtype;

pub fn apart(ev: &Evidence) -> Option<Parting> {
    let (ha, hb) = (&ev.a.header, &ev.b.header);
    // Only where both traces say how they ran (a recorder that knows autocast says it).
    let known = |h: &crate::evidence::TraceHeader| h.versions.is_some() || h.torch_version.is_some();
    if !known(ha) || !known(hb) {
        return None;
    }
    let word = |d: Option<Dtype>| d.map_or("off".to_string(), |d| d.name().to_string());
    let (what, left, right) = if ha.autocast != hb.autocast {
        ("autocast", word(ha.autocast), word(hb.autocast))
    } else if ha.dtype.is_some() && hb.dtype.is_some() && ha.dtype != hb.dtype {
        ("the weights' dtype", word(ha.dtype), word(hb.dtype))
    } else {
        return None;
    };
    let step = ev.first.or(Some(0));
    Some(Parting::new(step, Some(Stage::Precision), None, Numbers::PrecisionApart { what, left, right }))
}
