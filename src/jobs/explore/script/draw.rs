//! What `explore -- COMMAND` draws: W, K (a multiple of W), and where the command takes
//! them B, N (on and off multiples of W, W·B and a step's K·B), a seed and each axis's
//! value. proptest shrinks a draw towards fewer ranks, a smaller K, B and N, and the first
//! value of each axis.

use proptest::prelude::*;

use crate::spec::{Axis, Draw, Takes};

/// Most micro-batches per rank per step, B and whole steps of samples drawn.
const MAX_LOCAL: usize = 3;
const MAX_BATCH: usize = 4;
const MAX_WINDOWS: usize = 3;

/// The draws for a command taking `takes` and `axes`, W in 2..=max_gpus.
pub fn strategy(max_gpus: usize, takes: Takes, axes: &[Axis]) -> impl Strategy<Value = Draw> {
    let axes: Vec<Axis> = axes.to_vec();
    let picks: Vec<std::ops::Range<usize>> = axes.iter().map(|a| 0..a.values.len()).collect();
    let shape = (2..=max_gpus.max(2), 1..=MAX_LOCAL, 1..=MAX_BATCH, 1..=MAX_WINDOWS, 0..4usize, 0..64usize);
    (shape, 0..1000u64, picks).prop_map(move |((w, local, b, windows, off, raw), seed, picks)| {
        let k = local * w;
        let b_for_n = if takes.batch { b } else { 1 };
        Draw {
            gpus: w,
            acc_steps: k,
            batch: takes.batch.then_some(b),
            data_size: takes.data_size.then(|| data_size(w, local, b_for_n, windows, off, raw)),
            seed: takes.seed.then_some(seed),
            axes: axes.iter().zip(picks).map(|(a, i)| (a.name.clone(), a.values[i].clone())).collect(),
        }
    })
}

/// N: whole steps of K·B samples, plus (by `off`) nothing, whole W·B rows short of a step,
/// whole W short of a row, or fewer than W: every kind of remainder a sampler, a loader and
/// an accumulation window can meet.
fn data_size(w: usize, local: usize, b: usize, windows: usize, off: usize, raw: usize) -> usize {
    let step = w * local * b;
    let extra = match off {
        1 if local > 1 => w * b * (1 + raw % (local - 1)),
        2 if b > 1 => w * (1 + raw % (b - 1)),
        3 => 1 + raw % (w - 1),
        _ => 0,
    };
    windows * step + extra
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    fn all() -> Takes {
        Takes { batch: true, data_size: true, seed: true }
    }

    proptest! {
        /// K is a multiple of W, W within bounds, and N at least one step of samples.
        #[test]
        fn draws_are_valid(max in 2usize..6, seed in 0u64..1000) {
            let axes = [Axis { name: "lr".into(), values: vec!["0.1".into(), "1".into()] }];
            let mut runner = TestRunner::new_with_rng(Default::default(), proptest::test_runner::TestRng::deterministic_rng(proptest::test_runner::RngAlgorithm::ChaCha));
            for _ in 0..(seed % 7 + 1) {
                let d = strategy(max, all(), &axes).new_tree(&mut runner).unwrap().current();
                prop_assert!((2..=max).contains(&d.gpus));
                prop_assert_eq!(d.acc_steps % d.gpus, 0);
                prop_assert!(d.data_size.unwrap() >= d.acc_steps * d.batch.unwrap());
                prop_assert!(["0.1", "1"].contains(&d.axes["lr"].as_str()));
            }
        }
    }

    /// Every remainder kind is reachable: N on and off multiples of W, W·B and K·B.
    #[test]
    fn remainders_of_every_kind() {
        let (w, local, b) = (2, 2, 2);
        let n: Vec<usize> = (0..4).map(|off| data_size(w, local, b, 1, off, 0)).collect();
        assert_eq!(n, [8, 12, 10, 9]);
        assert!(n[1].is_multiple_of(w * b) && !n[1].is_multiple_of(8));
        assert!(n[2].is_multiple_of(w) && !n[2].is_multiple_of(w * b));
        assert!(!n[3].is_multiple_of(w));
    }

    /// Shrinking ends at two ranks, one micro-batch each, B=1, one step of samples, the
    /// first axis value.
    #[test]
    fn shrinks_to_the_smallest() {
        let axes = [Axis { name: "mode".into(), values: vec!["a".into(), "b".into(), "c".into()] }];
        let mut runner = TestRunner::deterministic();
        let mut tree = strategy(4, all(), &axes).new_tree(&mut runner).unwrap();
        while tree.simplify() {}
        let d = tree.current();
        assert_eq!((d.gpus, d.acc_steps, d.batch, d.data_size), (2, 2, Some(1), Some(2)));
        assert_eq!(d.axes["mode"], "a");
    }

    /// A command that takes no {batch}, {data_size} or {seed} gets none drawn.
    #[test]
    fn only_what_the_command_takes() {
        let mut runner = TestRunner::deterministic();
        let d = strategy(3, Takes::default(), &[]).new_tree(&mut runner).unwrap().current();
        assert_eq!((d.batch, d.data_size, d.seed), (None, None, None));
        assert_eq!(d.fills(), Vec::<(String, String)>::new());
    }
}
