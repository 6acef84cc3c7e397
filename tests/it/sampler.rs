//! The sampler port against `torch.utils.data.DistributedSampler` itself
//! (golden/sampler/cases.json, made by fixtures/sampler_cases.py).

use ddp_verify::plan::sampler::{accumulation_order, SamplerSpec};

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
