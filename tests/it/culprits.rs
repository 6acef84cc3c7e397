//! The right culprit on a script written unlike the project's examples
//! (tests/shipped/_plain_loop.py): the one process reads consecutive micro-batches from a
//! plain DataLoader, the ranks DistributedSampler's strided shares, so each step holds the
//! same samples grouped otherwise. Each mistake at W=2 and W=3, with and without clipping:
//! the stage, the owner and the factor's direction from the recorded facts, never "different
//! samples" where the samples are the same, and no false alarm on the honest loop.

use crate::util::{ddp_verify, flags, repo, stderr, stdout};

/// `ddp-verify FLAGS --report json -- python _plain_loop.py --grad-accum {local_acc_steps}
/// EXTRA`: (exit code, the JSON report). A leg that fails (exit 3: a rendezvous under a
/// loaded machine) runs once more.
fn plain(ddp_verify_flags: &str, extra: &str) -> (Option<i32>, serde_json::Value) {
    let t = tempfile::tempdir().unwrap();
    let report = t.path().join("report.json").display().to_string();
    let script = repo("tests/shipped/_plain_loop.py").display().to_string();
    let python = repo(".venv/bin/python").display().to_string();
    let mut args = flags(ddp_verify_flags);
    args.extend(["--report", "json", "--report-file", report.as_str(), "--", python.as_str(), script.as_str()]);
    args.extend(["--grad-accum", "{local_acc_steps}"]);
    args.extend(flags(extra));
    let mut out = ddp_verify(&args);
    if out.status.code() == Some(3) {
        eprintln!("{extra}: a leg failed once, running again:\n{}", stderr(&out));
        std::fs::remove_file(&report).ok();
        out = ddp_verify(&args);
    }
    let text = std::fs::read_to_string(&report).unwrap_or_else(|e| panic!("{e}: {}{}", stdout(&out), stderr(&out)));
    (out.status.code(), serde_json::from_str(&text).unwrap())
}

const W2: &str = "--acc-steps 4 --gpus 2";
const W3: &str = "--acc-steps 3 --gpus 3";

/// (reason, stage, owner, detail) of a report's cause.
fn cause(d: &serde_json::Value) -> (&str, &str, &str, &str) {
    let owner = d["owner"]["name"].as_str().or(d["owner"]["kind"].as_str()).unwrap_or("none");
    let (reason, stage) = (d["reason"].as_str().unwrap_or("none"), d["stage"].as_str().unwrap_or("none"));
    (reason, stage, owner, d["detail"].as_str().unwrap_or_default())
}

#[test]
fn the_same_samples_grouped_otherwise_are_no_false_alarm() {
    for (world, extra) in [(W2, ""), (W3, "--clip 0.05"), (W2, "--clip 0.05")] {
        let (code, r) = plain(world, extra);
        assert_eq!(code, Some(0), "{world} {extra}: {}", r["diagnosis"]);
    }
}

#[test]
fn a_loss_never_divided_is_named_by_its_scaling_not_by_the_grouping() {
    for (world, extra, k) in [(W2, "", 4), (W3, "", 3), (W3, "--clip 0.05", 3), (W2, "--clip 0.05", 4)] {
        let (code, r) = plain(world, &format!("--divide none {extra}"));
        let (reason, stage, owner, detail) = cause(&r["diagnosis"]);
        assert_eq!((code, stage, owner), (Some(1), "scaling", "script"), "{world} {extra}: {reason}: {detail}");
        // The direction: never divided, so divide; never "divided twice".
        let said = format!("accumulation scales each loss by 1.0000, {k}.00x what its {k} micro-batches");
        assert!(detail.contains(&said) && !detail.contains("divided twice"), "{world} {extra}: {detail}");
        // Clipping hid the factor in the applied gradients: the facts decide, said so.
        assert_eq!(extra.is_empty(), !detail.starts_with("clipping hid it"), "{world} {extra}: {detail}");
    }
}

#[test]
fn a_short_last_window_divided_by_k_is_named_against_the_big_batch() {
    // 40 samples, B=4: one process 10 micro-batches (windows of 4, 4, 2), each rank 5 (2, 2, 1).
    let (code, r) = plain(W2, "--batch {batch} --samples 40 --tail k");
    let (reason, stage, owner, detail) = cause(&r["big_batch"]["diagnosis"]);
    assert_eq!((code, reason, stage, owner), (Some(1), "short window scaling", "scaling", "script"), "{detail}");
    assert!(detail.contains("ran 2 micro-batch(es) per process where a window holds 4"), "{detail}");
    let (code, r) = plain(W2, "--batch {batch} --samples 40");
    assert_eq!(code, Some(0), "{}", r["big_batch"]["diagnosis"]);
}

#[test]
fn a_grouping_is_named_where_batchnorm_mixes_a_micro_batchs_samples() {
    let (code, r) = plain(W2, "--norm batch");
    let (reason, stage, owner, detail) = cause(&r["diagnosis"]);
    assert_eq!((code, reason, stage, owner), (Some(1), "samples grouped otherwise", "samples", "script"), "{detail}");
    assert!(detail.contains("1 BatchNorm layer in training mode"), "{detail}");
}
