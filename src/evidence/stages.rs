//! Stage facts as a trace holds them (the recorder's `_stages/`): per step, every rank's
//! micro-batches on their way from samples to backward (`batches.<s>`, rows of
//! [`BATCH_FIELDS`]), each parameter's local gradient summed over backwards and ranks before
//! any reduction (`local.<s>.<p>`), and the step calls a framework's optimizer wrapper took
//! (`step_calls.<s>`), and gradients zeroed inside the window (`zeroed.<s>`). The judge walks them in `judge::diagnose::stages`.

use std::collections::BTreeMap;

/// The columns of one `batches.<s>` row, in order (a NaN: not recorded). The recorder
/// writes by this list (generated into `_schema.py`).
pub const BATCH_FIELDS: [&str; 7] = ["rank", "fingerprint", "forward", "peeled", "root", "handed", "normaliser"];

/// One micro-batch (one backward) of one rank.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Batch {
    pub rank: usize,
    /// The inputs of the outermost module calls since the previous backward, hashed.
    pub fingerprint: Option<u64>,
    /// The scalar loss the model's forward returned.
    pub forward: Option<f64>,
    /// The root with its constant scalar factors peeled off the graph: the loss before scaling.
    pub peeled: Option<f64>,
    /// The value backward ran on.
    pub root: Option<f64>,
    /// The value handed to a framework's backward API.
    pub handed: Option<f64>,
    /// `num_items_in_batch`, where the forward was passed one.
    pub normaliser: Option<f64>,
}

impl Batch {
    /// The loss as the forward made it: the model's own where it returned one, else the
    /// root before its constant factors.
    pub fn loss(&self) -> Option<f64> {
        self.forward.or(self.peeled)
    }

    /// What scaled the loss before backward (root / loss), where both are known and the loss
    /// is not zero.
    pub fn scaling(&self) -> Option<f64> {
        let (root, loss) = (self.root?, self.loss()?);
        (loss != 0.0).then(|| root / loss).filter(|f| f.is_finite())
    }
}

/// One step's stage facts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StageStep {
    pub batches: Vec<Batch>,
    /// Per parameter: the sum of its local gradients over backwards and ranks, before any
    /// reduction.
    pub local: BTreeMap<String, f64>,
    /// Step calls through a framework's optimizer wrapper since the previous step.
    pub step_calls: Option<i64>,
    /// zero_grad calls after one of the step's backwards, before the step.
    pub zeroed: i64,
}

/// `batches.<s>`'s flat values as rows; None where the length is no whole number of rows.
pub fn rows(flat: &[f64]) -> Option<Vec<Batch>> {
    let n = BATCH_FIELDS.len();
    if !flat.len().is_multiple_of(n) {
        return None;
    }
    let known = |v: f64| v.is_finite().then_some(v);
    Some(
        flat.chunks(n)
            .map(|r| Batch {
                rank: r[0].max(0.0) as usize,
                fingerprint: known(r[1]).map(|v| v as u64),
                forward: known(r[2]),
                peeled: known(r[3]),
                root: known(r[4]),
                handed: known(r[5]),
                normaliser: known(r[6]),
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_read_by_the_fields_and_nan_is_unknown() {
        let flat = [1.0, 42.0, 2.0, f64::NAN, 0.5, f64::NAN, 7.0];
        let b = rows(&flat).unwrap();
        assert_eq!(b.len(), 1);
        assert_eq!((b[0].rank, b[0].fingerprint, b[0].loss(), b[0].scaling()), (1, Some(42), Some(2.0), Some(0.25)));
        assert_eq!((b[0].handed, b[0].normaliser), (None, Some(7.0)));
        assert!(rows(&flat[..6]).is_none());
    }
}
