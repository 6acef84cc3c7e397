//! Stage facts as a trace holds them (the recorder's `_stages/`): per step, every rank's
//! micro-batches on their way from samples to backward (`batches.<s>`, rows of
//! [`BATCH_FIELDS`]), each parameter's local gradient summed over backwards and ranks before
//! any reduction (`local.<s>.<p>`), and the step calls a framework's optimizer wrapper took
//! (`step_calls.<s>`), and gradients zeroed inside the window (`zeroed.<s>`). The judge walks them in `judge::diagnose::stages`.

use std::collections::BTreeMap;

/// The columns of one `batches.<s>` row, in order (a NaN: not recorded). The recorder
/// writes by this list (generated into `_schema.py`).
pub const BATCH_FIELDS: [&str; 9] =
    ["rank", "fingerprint", "forward", "peeled", "root", "handed", "normaliser", "samples", "every"];

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
    /// Autocast at its outermost forward: its dtype's digits (bfloat16 8, float16 11), 0 off
    /// (`autocast.<s>`); None where not recorded.
    pub autocast: Option<u32>,
    /// Where its samples (the rows of its first input) were hashed: the first of them in
    /// `StageStep::samples`, how many were kept, and 1 in how many rows (by hash value) was kept.
    pub rows: Option<Rows>,
}

/// A micro-batch's kept sample hashes within its step's `samples`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rows {
    pub start: usize,
    pub count: usize,
    pub every: u64,
}

impl StageStep {
    /// Both steps cut into micro-batches of the same inputs (their fingerprints equal as
    /// multisets): then each micro-batch runs the same ops on the same values in both. False
    /// where either did not fingerprint every micro-batch.
    pub fn same_grouping(&self, other: &StageStep) -> bool {
        let inputs = |s: &StageStep| -> Option<Vec<u64>> {
            let mut v: Vec<u64> = s.batches.iter().map(|b| b.fingerprint).collect::<Option<_>>()?;
            v.sort_unstable();
            Some(v)
        };
        matches!((inputs(self), inputs(other)), (Some(x), Some(y)) if !x.is_empty() && x == y)
    }

    /// Where `other` holds this step's samples grouped into other micro-batches (each
    /// micro-batch's samples hashed alike in both, the multisets equal, the micro-batches'
    /// inputs apart): how many micro-batches the step was cut into, the more of the two.
    /// None where either did not hash its samples, or they are not the same samples.
    pub fn regrouped(&self, other: &StageStep) -> Option<usize> {
        let every = |s: &StageStep| -> Option<Vec<u64>> { s.batches.iter().map(|b| b.rows.map(|r| r.every)).collect() };
        let (ea, eb) = (every(self)?, every(other)?);
        if ea.is_empty() || eb.is_empty() || ea.iter().chain(&eb).any(|e| *e != ea[0]) {
            return None;
        }
        let sorted = |mut v: Vec<u64>| {
            v.sort_unstable();
            v
        };
        if sorted(self.samples.clone()) != sorted(other.samples.clone()) {
            return None;
        }
        let inputs = |s: &StageStep| -> Option<Vec<u64>> { s.batches.iter().map(|b| b.fingerprint).collect() };
        (sorted(inputs(self)?) != sorted(inputs(other)?)).then(|| self.batches.len().max(other.batches.len()))
    }
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

    /// Its kept samples' hashes, out of its step's.
    pub fn samples<'a>(&self, step: &'a StageStep) -> Option<&'a [u64]> {
        let r = self.rows?;
        step.samples.get(r.start..r.start.checked_add(r.count)?)
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
    /// Every micro-batch's kept samples' hashes, in `batches` order (`Batch::rows`).
    pub samples: Vec<u64>,
}

/// `batches.<s>`'s flat values as rows; None where the length is no whole number of rows.
pub fn rows(flat: &[f64]) -> Option<Vec<Batch>> {
    let n = BATCH_FIELDS.len();
    if !flat.len().is_multiple_of(n) {
        return None;
    }
    let known = |v: f64| v.is_finite().then_some(v);
    let mut start = 0;
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
                autocast: None,
                rows: known(r[7]).zip(known(r[8])).map(|(count, every)| {
                    let rows = Rows { start, count: count.max(0.0) as usize, every: every.max(1.0) as u64 };
                    start = start.saturating_add(rows.count);
                    rows
                }),
            })
            .collect(),
    )
}

/// The step's sample hashes as the trace holds them (exact integers in float64); None where
/// the rows count more than there are.
pub fn samples(flat: &[f64], batches: &[Batch]) -> Option<Vec<u64>> {
    let want = batches.iter().filter_map(|b| b.rows).map(|r| r.start.saturating_add(r.count)).max().unwrap_or(0);
    (flat.len() >= want).then(|| flat.iter().map(|v| v.max(0.0) as u64).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_read_by_the_fields_and_nan_is_unknown() {
        let flat = [
            1.0,
            42.0,
            2.0,
            f64::NAN,
            0.5,
            f64::NAN,
            7.0,
            3.0,
            1.0,
            0.0,
            43.0,
            2.0,
            f64::NAN,
            0.5,
            f64::NAN,
            7.0,
            2.0,
            2.0,
        ];
        let b = rows(&flat).unwrap();
        assert_eq!(b.len(), 2);
        assert_eq!((b[0].rank, b[0].fingerprint, b[0].loss(), b[0].scaling()), (1, Some(42), Some(2.0), Some(0.25)));
        assert_eq!((b[0].handed, b[0].normaliser), (None, Some(7.0)));
        assert_eq!(b[1].rows, Some(Rows { start: 3, count: 2, every: 2 }));
        let step = StageStep { samples: samples(&[5.0, 6.0, 7.0, 8.0, 9.0], &b).unwrap(), ..StageStep::default() };
        assert_eq!(b[1].samples(&step), Some(&[8, 9][..]));
        assert!(samples(&[5.0], &b).is_none());
        assert!(rows(&flat[..8]).is_none());
        // A count no trace can hold (a damaged file) is refused, not an overflow.
        let mut huge = flat;
        huge[7] = 1e300;
        assert!(samples(&[5.0], &rows(&huge).unwrap()).is_none());
    }
}
