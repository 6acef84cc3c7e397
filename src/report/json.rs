//! JSON for machines. Schema (versioned by `schema_version`) documented in the README.

use serde_json::{json, Value};

use super::Exporter;
use crate::evidence::Params;
use crate::judge::Outcome;
use crate::judge::Verdict;

/// Bumped whenever a field changes meaning or disappears.
pub const JSON_SCHEMA_VERSION: u32 = 1;

pub struct Json;

impl Exporter for Json {
    fn render(&self, o: &Outcome) -> String {
        serde_json::to_string_pretty(&json(o)).expect("report serialises") + "\n"
    }
}

fn finals_json(p: &Params) -> Value {
    p.iter()
        .map(|(n, t)| {
            (n.clone(), json!(Vec::<f64>::try_from(&t.to_kind(tch::Kind::Double).flatten(0, -1)).unwrap_or_default()))
        })
        .collect()
}

pub fn json(o: &Outcome) -> Value {
    let mut v = json!({
        "schema_version": JSON_SCHEMA_VERSION,
        "tool_version": env!("CARGO_PKG_VERSION"),
        "libtorch_version": crate::evidence::golden::LIBTORCH_VERSION,
        "config": o.config.train,
        "device": o.config.train.device.name(),
        "device_note": o.config.device_note,
        "tolerance": o.config.tolerance,
        "verdict": if o.verdict() == Verdict::Diverged { "not-equivalent" } else { "equivalent" },
        "runs": o.runs,
        "diagnosis": o.diagnosis,
        "golden": o.golden,
    });
    // Every value of a ResNet's weights would make the report as large as the model: the
    // linear model's only. (Its traces hold them all, with --save-trace.)
    if !o.config.train.model.is_resnet() {
        v["final_weights"] =
            json!({ "accumulation": finals_json(&o.accumulation.finals), "ddp": finals_json(&o.ddp.finals) });
    }
    v
}
