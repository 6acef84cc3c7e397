//! Cautions beside an equivalence: runs that agree only because both clipped every step.

use crate::judge::diagnose::measure::factor::{is_whole, NORM_REL};
use crate::judge::diagnose::parting::{Numbers, Parting};
use crate::judge::diagnose::{Evidence, Stage};

/// The total norms before clipping differ by one factor throughout (a loss divided twice,
/// say). The applied gradients are the same, so the verdict stands; once the norm falls
/// under max_norm the runs part.
pub fn hidden_factor(ev: &Evidence) -> Option<Parting> {
    let (na, nb) = (&ev.a.facts.clip_norms, &ev.b.facts.clip_norms);
    let pairs: Option<Vec<_>> = (0..na.len().min(nb.len()))
        .map(|s| {
            let ((ta, ma), (tb, mb)) = (na[s]?, nb[s]?);
            (ta > ma && tb > mb && ta > 0.0).then_some((ta, tb, ma))
        })
        .collect();
    let pairs = pairs.filter(|p| !p.is_empty())?;
    let (ta, tb, max) = pairs[0];
    let ratio = tb / ta;
    let steady = pairs.iter().all(|&(x, y, _)| ((y / x) / ratio - 1.0).abs() <= NORM_REL);
    if !steady || (ratio - 1.0).abs() <= 1e-2 {
        return None;
    }
    let numbers =
        Numbers::HiddenFactor { ratio, steps: pairs.len(), norms: (ta, tb), max, whole: is_whole(ratio, NORM_REL) };
    Some(Parting::new(Some(0), Some(Stage::Scaling), None, numbers))
}
