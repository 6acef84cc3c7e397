//! Every optimizer's param groups as a trace holds them (`groups.<s>`, rows of
//! [`GROUP_FIELDS`](super::schema::GROUP_FIELDS)): what each step's update was told to do,
//! group by group, so that two runs can be held to the same settings before their numbers
//! are weighed (a second group's warm-up, a weight decay of its own).

use super::schema::GROUP_FIELDS;

/// One param group of one optimizer at one step (None: the group has no such setting).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Group {
    /// The optimizer's index, in the order the recorder first saw each step.
    pub optimizer: usize,
    pub group: usize,
    /// Parameters in the group.
    pub params: Option<f64>,
    pub lr: Option<f64>,
    pub weight_decay: Option<f64>,
    pub beta1: Option<f64>,
    pub beta2: Option<f64>,
    pub eps: Option<f64>,
    pub momentum: Option<f64>,
}

impl Group {
    /// Each setting two runs must share, by its column's name.
    pub fn settings(&self) -> [(&'static str, Option<f64>); 7] {
        [
            ("params", self.params),
            ("lr", self.lr),
            ("weight_decay", self.weight_decay),
            ("beta1", self.beta1),
            ("beta2", self.beta2),
            ("eps", self.eps),
            ("momentum", self.momentum),
        ]
    }
}

/// `groups.<s>`'s flat values as rows; None where the length is no whole number of rows.
pub fn rows(flat: &[f64]) -> Option<Vec<Group>> {
    let n = GROUP_FIELDS.len();
    if flat.is_empty() || !flat.len().is_multiple_of(n) {
        return None;
    }
    let known = |v: f64| v.is_finite().then_some(v);
    Some(
        flat.chunks(n)
            .map(|r| Group {
                optimizer: r[0].max(0.0) as usize,
                group: r[1].max(0.0) as usize,
                params: known(r[2]),
                lr: known(r[3]),
                weight_decay: known(r[4]),
                beta1: known(r[5]),
                beta2: known(r[6]),
                eps: known(r[7]),
                momentum: known(r[8]),
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_read_by_the_columns_and_nan_is_unset() {
        let flat = [0.0, 1.0, 4.0, 1e-3, f64::NAN, 0.9, 0.999, 1e-8, f64::NAN];
        let g = rows(&flat).expect("one row");
        assert_eq!((g[0].optimizer, g[0].group, g[0].lr, g[0].weight_decay), (0, 1, Some(1e-3), None));
        assert_eq!(rows(&flat[..8]), None);
        assert_eq!(rows(&[]), None);
    }
}
