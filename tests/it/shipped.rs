//! Bugs that shipped in real libraries (tests/shipped/cases.toml: each with the version that
//! had it and the version that fixed it, under an ordinary script that is right), each through
//! `ddp-verify --acc-steps 4 --gpus 2 -- PYTHON train.py`: the buggy version NOT EQUIVALENT
//! with the case's stage and the library at its pinned version as the owner, the fixed one
//! EQUIVALENT. The environments are scripts/setup-shipped.sh's; tests/shipped/run.py runs
//! the cases (and holds every exit code); these tests hold what each report says. Under
//! `ddp-verify watch` too: each case's DDP leg (torchrun over W, the command `watch` runs),
//! judged alone by its stages' contracts. The corpus runs once for both tests (each version
//! recorded once, about half the time two runs of it took).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::util::repo;

#[test]
fn shipped_bugs_get_their_verdict_stage_and_owner_on_both_versions() {
    corpus(false);
}

/// One run of each case's DDP command: the buggy version breaks a contract at the stage and
/// owner the two-run check names, the fixed one keeps them all; a case whose `watch` says why
/// no contract can see its bug keeps them in both versions.
#[test]
fn shipped_bugs_break_a_contract_in_one_run_under_watch() {
    corpus(true);
}

/// tests/shipped/run.py once: the folder its reports, logs and traces are in (cargo's
/// temporary folder for tests, emptied first: left for a look after a failure), and its output.
fn ran() -> &'static (PathBuf, String) {
    static RAN: OnceLock<(PathBuf, String)> = OnceLock::new();
    RAN.get_or_init(|| {
        let keep = Path::new(env!("CARGO_TARGET_TMPDIR")).join("shipped");
        let _ = std::fs::remove_dir_all(&keep);
        std::fs::create_dir_all(&keep).unwrap();
        let out = Command::new(repo(".venv/bin/python"))
            .arg(repo("tests/shipped/run.py"))
            .env("DDP_VERIFY", env!("CARGO_BIN_EXE_ddp-verify"))
            .env("SHIPPED_KEEP", &keep)
            .output()
            .expect("tests/shipped/run.py runs");
        let log = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "a shipped bug's verdict (run scripts/setup-shipped.sh first):\n{log}");
        (keep, log)
    })
}

fn corpus(watch: bool) {
    let (keep, log) = ran();
    let manifest: toml::Value = std::fs::read_to_string(repo("tests/shipped/cases.toml")).unwrap().parse().unwrap();
    let cases = manifest["case"].as_array().expect("[[case]]");
    let libraries: std::collections::BTreeSet<&str> = cases.iter().filter_map(|c| c["library"].as_str()).collect();
    assert!(cases.len() >= 10 && libraries.len() >= 5, "the corpus: {} bugs from {libraries:?}", cases.len());
    let open = cases.iter().filter(|c| c.get("cause_open").is_some()).count();
    assert!(open * 4 <= cases.len(), "most causes must be named: {open} open of {}", cases.len());
    let unseen = cases.iter().filter(|c| c.get("watch").is_some()).count();
    assert!(unseen * 4 <= cases.len(), "one run must see most bugs: {unseen} unseen of {}", cases.len());
    // Where each report keeps its cause.
    let cause = |report: &serde_json::Value| match watch {
        true => report["fault"]["diagnosis"].clone(),
        // DDP and accumulation agree where only the big batch parts (an epoch's short window).
        false if report["diagnosis"].is_null() => report["big_batch"]["diagnosis"].clone(),
        false => report["diagnosis"].clone(),
    };
    let mut wrong = vec![];
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let read = |side: &str| -> serde_json::Value {
            let file = if watch { format!("{name}.{side}.watch.json") } else { format!("{name}.{side}.json") };
            let text = std::fs::read_to_string(keep.join(file)).unwrap();
            serde_json::from_str(&text).unwrap()
        };
        let (buggy, fixed) = (read("buggy"), read("fixed"));
        assert!(cause(&fixed).is_null(), "{name}: the fixed version has a cause: {fixed}");
        let d = &cause(&buggy);
        if watch && case.get("watch").is_some() {
            assert!(d.is_null(), "{name}: said unseen in one run, yet a contract broke: {buggy}");
            continue;
        }
        assert!(!d.is_null(), "{name}: the buggy version has no cause: {buggy}");
        if case.get("cause_open").is_some() {
            continue; // an open gap, said in the manifest: the verdicts alone are held
        }
        let library = case["library"].as_str().unwrap();
        // The version the library ran at: the buggy side's pin of it, where pinned.
        let pinned = case["buggy"].get("pins").and_then(|p| p.as_array()).and_then(|pins| {
            pins.iter().filter_map(|p| p.as_str()?.split_once("==")).find(|(n, _)| n.contains(library)).map(|(_, v)| v)
        });
        let said = (d["stage"].as_str(), d["owner"]["name"].as_str());
        let version = d["owner"]["version"].as_str();
        let version_ok = pinned.is_none_or(|v| version.is_some_and(|have| have.starts_with(v)));
        if said != (case["stage"].as_str(), Some(library)) || !version_ok {
            wrong.push(format!("{name}: said {said:?} at {version:?}, want {:?} at {pinned:?}: {d}", case["stage"]));
        }
        // The direction and size of a factor, or the mechanism, where the case says them.
        if let Some(says) = case.get("says").and_then(|v| v.as_str()) {
            if !d["detail"].as_str().unwrap_or_default().contains(says) {
                wrong.push(format!("{name}: the cause does not say {says:?}: {d}"));
            }
        }
        // Advice about a library never asks for the script to change what it does right.
        let detail = d["detail"].as_str().unwrap_or_default();
        assert!(detail.contains("not your") || detail.contains("upgrade"), "{name}: {detail}");
    }
    assert!(wrong.is_empty(), "{}\n{log}", wrong.join("\n"));
}
