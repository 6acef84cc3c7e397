//! A few of the sweep's cheapest configurations (bench/sweep/run.py), run again as CI runs
//! users' examples (`.venv-current`: the sweep's pins of torch, Transformers and Accelerate;
//! TRL and PEFT are the sweep's alone): each must come out as the committed sweep found it
//! (bench/sweep/results.json), its verdict, stage, reason and owner under both checks. One a
//! false alarm the sweep found (two param groups at W=3), one documented behaviour named as
//! the script's setting, one an upstream bug that only `watch` sees (docs/findings/).

use std::process::Command;

use crate::util::{repo, stdout, users};

/// The committed sweep's row for `path` at W, K in float32.
fn recorded(path: &str, w: u64, k: u64) -> serde_json::Value {
    let text = std::fs::read_to_string(repo("bench/sweep/results.json")).expect("bench/sweep/results.json");
    let rows: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap();
    rows.into_iter()
        .find(|r| r["path"] == path && r["gpus"] == w && r["acc_steps"] == k && r["dtype"] == "float32")
        .unwrap_or_else(|| panic!("bench/sweep/results.json has no {path} at W={w} K={k} float32"))
}

/// The path's command in bench/sweep/configs.toml, with the users' Python.
fn command(path: &str) -> Vec<String> {
    let text = std::fs::read_to_string(repo("bench/sweep/configs.toml")).unwrap();
    let cfg: toml::Value = toml::from_str(&text).unwrap();
    let found = cfg["path"].as_array().unwrap().iter().find(|p| p["name"].as_str() == Some(path)).expect(path);
    let python = users("python");
    let words = found["command"].as_str().unwrap().replace("{python}", &python);
    // The repository's files by absolute path: the check runs in a folder of its own.
    let at = |w: &str| match !w.starts_with('-') && repo(w).exists() {
        true => repo(w).display().to_string(),
        false => w.to_string(),
    };
    words.split_whitespace().map(at).collect()
}

/// What a report's diagnosis says: (stage, reason, owner's name and version, or its kind).
fn said(report: &serde_json::Value) -> (serde_json::Value, serde_json::Value, String) {
    let d = &report["diagnosis"];
    let owner = [&d["owner"]["name"], &d["owner"]["version"]].iter().filter_map(|v| v.as_str()).collect::<Vec<_>>();
    let owner = match owner.is_empty() {
        true => d["owner"]["kind"].as_str().unwrap_or_default().to_string(),
        false => owner.join(" "),
    };
    (d["stage"].clone(), d["reason"].clone(), owner)
}

fn as_swept(path: &str, w: u64, k: u64) {
    let want = recorded(path, w, k);
    let dir = tempfile::tempdir().unwrap();
    let (report, watched, traces) = (dir.path().join("r.json"), dir.path().join("w.json"), dir.path().join("t"));
    let out = Command::new(env!("CARGO_BIN_EXE_ddp-verify"))
        .args(["--acc-steps", &k.to_string(), "--gpus", &w.to_string(), "--timeout", "300", "--report", "json"])
        .args(["--force", "--report-file"])
        .arg(&report)
        .arg("--save-trace")
        .arg(&traces)
        .arg("--")
        .args(command(path))
        .current_dir(dir.path())
        .output()
        .expect("ddp-verify runs");
    let watch = Command::new(env!("CARGO_BIN_EXE_ddp-verify"))
        .args(["watch", "--report", "json", "--force", "--trace"])
        .arg(traces.join("ddp.safetensors"))
        .arg("--report-file")
        .arg(&watched)
        .output()
        .expect("ddp-verify watch runs");
    let read = |p: &std::path::Path| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{e}: {}", stdout(&out)))).unwrap()
    };
    let (two, one) = (read(&report), read(&watched));
    assert_eq!(out.status.code().map(i64::from), want["exit"].as_i64(), "{path}: {two}");
    assert_eq!(watch.status.code().map(i64::from), want["watch_exit"].as_i64(), "{path}: {one}");
    for (got, key) in [(said(&two), "two_runs"), (said(&one["fault"]), "watch")] {
        let w = &want[key];
        if w["reason"].is_string() {
            let owner = w["owner"].as_str().unwrap_or_default().to_string();
            assert_eq!(got, (w["stage"].clone(), w["reason"].clone(), owner), "{path} ({key}): {two} {one}");
        }
    }
}

/// Two param groups of their own learning rates at W=3: the carried AdamW bound held every
/// parameter to the first group's rate, 10x too tight for the other (a false alarm).
#[test]
fn two_param_groups_at_w3_are_equivalent_as_swept() {
    as_swept("trainer-param-groups", 3, 6);
}

/// average_tokens_across_devices=False set by the script: each rank's own token count, the
/// script's setting (documented), under both checks.
#[test]
fn a_per_rank_token_count_the_script_set_is_named_as_swept() {
    as_swept("trainer-no-average-tokens", 2, 4);
}

/// Accelerate divides an epoch's short last window by the full accumulation count: the two
/// runs agree (both do it), `watch`'s scaling contract names it (docs/findings/).
#[test]
fn accelerates_short_last_window_is_named_by_watch_as_swept() {
    as_swept("accumulate-short-window", 2, 4);
}
