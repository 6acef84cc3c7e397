//! Dropout: masks drawn from different keys (ours record them), or a user's model that
//! trains with dropout on (the recorder's header names its layers).

use crate::judge::diagnose::parting::{Numbers, Parting};
use crate::judge::diagnose::{Evidence, Stage};

/// The same samples' dropout masks drawn from different keys in the first differing step
/// (other samples draw other masks too: only the same samples keyed otherwise is this).
pub fn keys(ev: &Evidence) -> Option<Parting> {
    let s = ev.first?;
    let (m, n) = (ev.a.facts.dropout_keys.get(s)?, ev.b.facts.dropout_keys.get(s)?);
    let same_samples = ev.cx.same_samples != Some(false);
    (m != n && same_samples).then(|| Parting::new(Some(s), Some(Stage::Loss), None, Numbers::DropoutKeys))
}

/// A user's model that trains with dropout on: each run draws its own masks, DDP's ranks
/// from their own generators, so no two runs apply the same gradients and nothing finer can
/// be said of the difference.
pub fn on(ev: &Evidence) -> Option<Parting> {
    let s = ev.first.filter(|_| !ev.cx.ours())?;
    let (side, layers) = ev.sides().into_iter().find_map(|(side, t)| Some((side, t.header.dropout.clone()?)))?;
    Some(Parting::new(Some(s), Some(Stage::Loss), Some(side), Numbers::DropoutOn { layers }))
}
