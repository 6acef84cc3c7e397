//! JSON for machines. Schema (versioned by `schema_version`) documented in the README.

use serde_json::{json, Value};

use super::Exporter;
use crate::evidence::Params;
use crate::judge::{Outcome, Subject};

/// Bumped whenever a field changes meaning or disappears.
pub const JSON_SCHEMA_VERSION: u32 = 1;

pub struct Json;

impl Exporter for Json {
    fn render(&self, o: &Outcome) -> String {
        serde_json::to_string_pretty(&json(o)).expect("report serialises") + "\n"
    }
}

fn finals_json(p: &Params) -> Value {
    p.iter().map(|(n, t)| (n.clone(), json!(t.to_f64()))).collect()
}

pub fn json(o: &Outcome) -> Value {
    let mut v = json!({
        "schema_version": JSON_SCHEMA_VERSION,
        "tool_version": env!("CARGO_PKG_VERSION"),
        "libtorch_version": crate::evidence::golden::LIBTORCH_VERSION,
    });
    match &o.subject {
        Subject::Run(cfg) => {
            v["config"] = json!(cfg.train);
            v["device"] = json!(cfg.train.run.device.name());
            v["device_note"] = json!(cfg.device_note);
            v["kernels"] = json!(cfg.kernels);
            v["cost"] = json!(o.ddp_cost());
        }
        // `compare`: the files and their headers instead of a configuration.
        Subject::Traces(pair) => {
            let side = |i: usize| json!({ "path": pair.paths[i], "meta": pair.headers[i] });
            v["traces"] = json!({
                "left": side(0),
                "right": side(1),
                "magnitudes": pair.magnitudes,
                "peaks": pair.peaks,
                "sampling": pair.sampling,
                "cost": o.costs,
                "precision": match &pair.precision {
                    Some(Ok(h)) => json!(h),
                    Some(Err(why)) => json!({ "unused": why }),
                    None => json!(null),
                },
            });
        }
    }
    v["tolerance"] = json!(o.tolerance());
    v["verdict"] = json!(o.verdict().word());
    if let Some(why) = &o.no_verdict {
        v["no_verdict"] = json!({ "message": why.line(), "kernels": why });
        return v;
    }
    v["runs"] = json!(o.runs);
    v["diagnosis"] = json!(o.diagnosis);
    v["caution"] = json!(o.caution);
    if !o.notes.is_empty() {
        v["notes"] = json!(o.notes);
    }
    if let Some(cfg) = o.config() {
        v["big_batch"] = match &o.big_batch {
            Some(b) => json!({
                "run": super::describe::big_batch_words(&cfg.train),
                "comparison": b.comparison,
                "diagnosis": b.diagnosis,
            }),
            None => json!({ "run": super::describe::big_batch_words(&cfg.train) }),
        };
    } else if let Some(b) = &o.big_batch {
        v["big_batch"] = json!({ "run": "a recorded trace", "comparison": b.comparison, "diagnosis": b.diagnosis });
    }
    v["golden"] = json!(o.golden);
    // Every value of a ResNet's weights would make the report as large as the model: the
    // linear model's only. (Its traces hold them all, with --save-trace.)
    if !super::describe::wide(o) {
        v["final_weights"] = json!({ o.runs.left.clone(): finals_json(&o.accumulation.finals), o.runs.right.clone(): finals_json(&o.ddp.finals) });
    }
    v
}
