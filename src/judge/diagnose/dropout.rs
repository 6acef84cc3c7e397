//! Dropout: masks drawn from different keys (ours record them), or a user's model that
//! trains with dropout on (the recorder's header names its layers).

use super::{Diagnosis, Evidence};
use crate::judge::Reason;

/// The same samples' dropout masks drawn from different keys in the first differing step
/// (other samples draw other masks too: only the same samples keyed otherwise is this).
pub fn keys(ev: &Evidence) -> Option<Diagnosis> {
    let s = ev.first?;
    let (m, n) = (ev.a.facts.dropout_keys.get(s)?, ev.b.facts.dropout_keys.get(s)?);
    (m != n && ev.cx.same_samples != Some(false)).then(|| Diagnosis {
        reason: Reason::DropoutMasks,
        located: None,
        detail: format!(
            "{} and {} drew step {s}'s dropout masks from different keys: masks must follow the samples \
             (seed, epoch, sample index, layer), not each rank's own counter or stream, or ranks repeat one \
             another's masks",
            ev.left(),
            ev.right()
        ),
    })
}

/// A user's model that trains with dropout on: each run draws its own masks, DDP's ranks
/// from their own generators, so no two runs apply the same gradients and nothing finer can
/// be said of the difference.
pub fn users(ev: &Evidence) -> Option<Diagnosis> {
    let s = ev.first.filter(|_| !ev.cx.ours())?;
    let sides = [(ev.left(), ev.a), (ev.right(), ev.b)];
    let (label, layers) = sides.into_iter().find_map(|(l, t)| Some((l, t.header.dropout.as_ref()?)))?;
    Diagnosis::new(
        Reason::DropoutMasks,
        format!(
            "step {s} differs by more than rounding, and {label}'s model trains with dropout on ({layers}): each run \
             draws its own masks (DDP's ranks from their own random streams, the one process from one stream), so \
             the runs apply different gradients whatever else is right; check with dropout off (p=0 for the check) \
             to see the rest"
        ),
    )
}
