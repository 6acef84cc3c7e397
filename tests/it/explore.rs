//! explore on real MPI ranks: random configs agree, and every planted bug is caught
//! wherever it changes the math. PROPTEST_CASES sets the cases per pass.

use crate::util::{ddp_verify, flags, stderr, stdout};

fn cases() -> String {
    std::env::var("PROPTEST_CASES").unwrap_or_else(|_| "40".into())
}

/// explore over linear configurations on 3 ranks, with `extra` flags.
fn explore_linear(extra: &str) -> std::process::Output {
    ddp_verify(&flags(&format!("explore --model linear --cases {} --max-gpus 3 {extra}", cases())))
}

#[test]
fn accumulation_and_ddp_agree_on_random_configurations() {
    let tmp = tempfile::tempdir().unwrap();
    let reg = tmp.path().join("regressions.txt");
    let out = explore_linear(&format!("--seed 7 --regressions {}", reg.display()));
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}{}", stderr(&out));
    assert!(text.contains("\nEQUIVALENT on every case"), "{text}");
    assert!(!reg.exists(), "a passing explore wrote a regression");
}

/// Kernels that do not repeat themselves (the test hook): every case is counted apart, as no
/// verdict, never a pass nor a false alarm, and explore exits 4.
#[test]
fn cases_whose_kernels_do_not_repeat_get_no_verdict() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ddp-verify"))
        .args(flags("explore --model linear --cases 5 --max-gpus 2 --seed 1 --json"))
        .env("DDP_VERIFY_TEST_UNREPEATABLE", "1")
        .output()
        .unwrap();
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(4), "{text}{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_str(&text).unwrap();
    let t = &report["tallies"][0];
    assert_eq!((t["no_verdict"].as_u64(), t["not_equivalent"].as_u64()), (t["cases"].as_u64(), Some(0)), "{t}");
}

#[test]
fn every_injected_bug_is_caught_wherever_it_changes_the_math() {
    let out = explore_linear("--seed 3 --inject all --json");
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_str(&text).expect("explore --json prints JSON");
    let tallies = report["tallies"].as_array().expect("tallies");
    use ddp_verify::spec::{Bug, ModelKind};
    let bugs = Bug::ALL.iter().filter(|b| b.applies_to(ModelKind::Linear)).map(|b| b.name());
    assert!(tallies.iter().all(|t| t["bug"] != "count-per-rank"), "a pass for a bug linear cannot carry: {text}");
    for bug in bugs {
        let t = tallies.iter().find(|t| t["bug"] == bug).unwrap_or_else(|| panic!("{bug}: {text}"));
        let n = |key: &str| t[key].as_u64().unwrap_or_else(|| panic!("{bug}: no {key} in {t}"));
        assert_eq!((n("caught"), n("missed"), n("false_alarms")), (n("changes_math"), 0, 0), "{bug}: {t}");
        assert!(n("caught") > 0, "{bug} never exercised: {t}");
        assert!(n("caught") + n("reordered") <= n("cases"), "{bug}: {t}");
    }
}

/// One exposing config per bug, through the main command: exit 1 and the cause in words.
#[test]
fn each_injected_bug_is_reported_with_its_likely_cause() {
    let cases: [(&str, &[&str], &str); 6] = [
        ("no-loss-scale", &["--acc-steps", "2", "--gpus", "2"], "exactly 0.50x"),
        ("double-scale", &["--acc-steps", "2", "--gpus", "2"], "exactly 2.00x"),
        ("contiguous-split", &["--data-size", "16", "--batch-size", "2"], "different samples"),
        ("no-set-epoch", &["--data-size", "16", "--batch-size", "2", "--shuffle", "--epochs", "2"], "set_epoch"),
        ("no-padding", &["--data-size", "9", "--batch-size", "1", "--epochs", "2"], "micro-batches"),
        ("stale-zero-grad", &["--epochs", "3"], "not zeroed"),
    ];
    for (bug, flags, cause) in cases {
        let mut args = vec!["--inject", bug];
        args.extend_from_slice(flags);
        let out = ddp_verify(&args);
        let text = stdout(&out);
        assert_eq!(out.status.code(), Some(1), "{bug}: {text}{}", stderr(&out));
        assert!(text.contains("NOT EQUIVALENT") && text.contains(cause), "{bug}: {text}");
    }
}

#[test]
fn an_unknown_bug_is_refused_naming_the_known_ones() {
    let out = ddp_verify(&["explore", "--inject", "typo"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("no-loss-scale"), "{}", stderr(&out));
}

#[test]
fn regressions_needing_more_ranks_than_started_are_skipped_and_said_so() {
    let tmp = tempfile::tempdir().unwrap();
    let reg = tmp.path().join("regressions.txt");
    let w1 = r#"{"data_size":6,"features":2,"seed":1,"epochs":1,"batch_size":2,"acc_steps":1,"gpus":1,"lr":0.01,"momentum":0.9,"shuffle":false,"drop_last":false}"#;
    let w3 = r#"{"data_size":12,"features":3,"seed":1,"epochs":1,"batch_size":2,"acc_steps":3,"gpus":3,"lr":0.01,"momentum":0.9,"shuffle":false,"drop_last":false}"#;
    std::fs::write(&reg, format!("# header\n{w1}\n{w3}\n")).unwrap();
    let out = ddp_verify(&[
        "explore",
        "--cases",
        "5",
        "--max-gpus",
        "1",
        "--seed",
        "1",
        "--regressions",
        reg.to_str().unwrap(),
    ]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}{}", stderr(&out));
    assert!(text.contains("(1 replayed from the regressions file first)"), "{text}");
    assert!(text.contains("(1 regressions skipped"), "{text}");
}
