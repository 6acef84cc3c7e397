//! The sampler port against `torch.utils.data.DistributedSampler` itself
//! (golden/sampler/cases.json, made by fixtures/sampler_cases.py).

use std::collections::BTreeSet;

use ddp_verify::plan::sampler::{accumulation_order, rank_batches, SamplerSpec};
use proptest::prelude::*;

use crate::util::json_file;

fn cases() -> Vec<serde_json::Value> {
    json_file("golden/sampler/cases.json")["cases"].as_array().unwrap().clone()
}

fn spec(c: &serde_json::Value) -> SamplerSpec {
    SamplerSpec {
        data_size: c["data_size"].as_u64().unwrap() as usize,
        world: c["gpus"].as_u64().unwrap() as usize,
        shuffle: c["shuffle"].as_bool().unwrap(),
        seed: c["seed"].as_u64().unwrap(),
        drop_last: c["drop_last"].as_bool().unwrap(),
    }
}

fn lists(v: &serde_json::Value) -> Vec<Vec<i64>> {
    serde_json::from_value(v.clone()).unwrap()
}

#[test]
fn distributed_sampler_port_matches_torch_on_every_committed_case() {
    let cases = cases();
    assert!(cases.len() > 100);
    for c in &cases {
        let shards = spec(c).shards(c["epoch"].as_u64().unwrap());
        assert_eq!(shards, lists(&c["shards"]), "case {c}");
    }
}

#[test]
fn mimicking_sampler_matches_the_python_reference_order() {
    for c in &cases() {
        let shards = spec(c).shards(c["epoch"].as_u64().unwrap());
        let order: Vec<Vec<i64>> = accumulation_order(&shards, c["batch_size"].as_u64().unwrap() as usize)
            .into_iter()
            .map(|m| m.indices)
            .collect();
        assert_eq!(order, lists(&c["accumulation_order"]), "case {c}");
    }
}

// Properties of the split over random configurations. PROPTEST_CASES raises the count.
#[derive(Debug, Clone)]
struct SplitCase {
    spec: SamplerSpec,
    batch_size: usize,
    acc_steps: usize,
    epoch: u64,
}

prop_compose! {
    /// K is drawn as a multiple of W, and N at least W, as the tool requires.
    fn split_case()(world in 1usize..=5)(
        world in Just(world),
        local_acc in 1usize..=4,
        data_size in world..=40,
        batch_size in 1usize..=6,
        shuffle in any::<bool>(),
        seed in 0u64..1000,
        epoch in 0u64..5,
        drop_last in any::<bool>(),
    ) -> SplitCase {
        SplitCase {
            spec: SamplerSpec { data_size, world, shuffle, seed, drop_last },
            batch_size,
            acc_steps: local_acc * world,
            epoch,
        }
    }
}

fn sorted(batches: &[Vec<i64>]) -> Vec<Vec<i64>> {
    let mut v = batches.to_vec();
    v.sort();
    v
}

proptest! {
    #![proptest_config(crate::util::proptest_config(64))]

    #[test]
    fn each_accumulation_window_holds_exactly_the_ranks_batches_of_that_step(case in split_case()) {
        let SplitCase { spec, batch_size, acc_steps, epoch } = case;
        let shards = spec.shards(epoch);
        let order: Vec<Vec<i64>> = accumulation_order(&shards, batch_size).into_iter().map(|m| m.indices).collect();
        let per_rank: Vec<Vec<Vec<i64>>> = shards.iter().map(|s| rank_batches(s, batch_size)).collect();
        let local = acc_steps / spec.world;
        // Full windows step; a trailing partial window is carried the same way on both sides.
        for (w, window) in order.chunks(acc_steps).enumerate() {
            let lo = w * local;
            let ranks: Vec<Vec<i64>> = per_rank
                .iter()
                .flat_map(|b| b[lo..(lo + local).min(b.len())].to_vec())
                .collect();
            prop_assert_eq!(sorted(window), sorted(&ranks), "window {}", w);
        }
        prop_assert_eq!(order.len(), per_rank.iter().map(Vec::len).sum::<usize>());
    }

    #[test]
    fn shards_are_equal_sized_and_cover_the_data_unless_drop_last(case in split_case()) {
        let SplitCase { spec, epoch, .. } = case;
        let shards = spec.shards(epoch);
        let n = spec.num_samples();
        prop_assert!(shards.iter().all(|s| s.len() == n));
        let seen: BTreeSet<i64> = shards.iter().flatten().copied().collect();
        if spec.drop_last {
            // No sample twice, and fewer than W left out.
            prop_assert_eq!(seen.len(), n * spec.world);
            prop_assert!(spec.data_size - seen.len() < spec.world);
        } else {
            prop_assert_eq!(seen, (0..spec.data_size as i64).collect::<BTreeSet<_>>());
            prop_assert!(n * spec.world - spec.data_size < spec.world);
        }
    }

    #[test]
    fn the_same_epoch_gives_the_same_shuffle_and_another_epoch_may_differ(case in split_case()) {
        let SplitCase { spec, epoch, .. } = case;
        let first = spec.shards(epoch);
        // Other draws in between (another epoch, another seed) must not change it: each
        // epoch reseeds, as DistributedSampler's generator does.
        let other = spec.shards(epoch + 1);
        let _ = SamplerSpec { seed: spec.seed + 1, ..spec }.shards(epoch);
        prop_assert_eq!(&first, &spec.shards(epoch));
        let perm = |shards: &Vec<Vec<i64>>| {
            let mut all: Vec<i64> = shards.concat();
            all.sort_unstable();
            all.dedup();
            all
        };
        // Either epoch deals the same samples (all of them, unless drop_last cuts some).
        if !spec.drop_last {
            prop_assert_eq!(perm(&first), (0..spec.data_size as i64).collect::<Vec<_>>());
        }
        if !spec.shuffle {
            prop_assert_eq!(&first, &other);
        } else if spec.data_size >= 8 {
            // 8! orderings: ten epochs that all deal the same is a broken reseed, not chance.
            let differs = (1..=10).any(|e| spec.shards(epoch + e) != first);
            prop_assert!(differs, "ten epochs of {:?} all shuffled alike", spec);
        }
    }
}
