//! tiny-lm, its token-level loss and the big batch: equivalent runs pass against
//! DDP and against one big batch, and each mistake LM trainers have shipped is caught with
//! its own cause, on the comparison that can see it.

use crate::util::{ddp_verify, flags, stderr, stdout};

/// Runs ddp-verify with a JSON report: (exit code, the whole report).
fn judged(args: &[&str]) -> (Option<i32>, serde_json::Value) {
    let mut all = args.to_vec();
    all.extend(["--report", "json"]);
    let out = ddp_verify(&all);
    let text = stdout(&out);
    let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{args:?}: {e}: {text}{}", stderr(&out)));
    (out.status.code(), v)
}

#[test]
fn tiny_lm_is_equivalent_to_ddp_and_to_the_big_batch() {
    for case in [
        "--model tiny-lm",
        "--model tiny-lm --gpus 3 --acc-steps 6 --data-size 30 --batch-size 3 --shuffle --epochs 3",
        "--model tiny-lm --gpus 4 --acc-steps 4 --data-size 21 --batch-size 2 --min-len 2 --dtype float64",
        "--model tiny-lm --free-running --max-steps 2",
    ] {
        let (code, r) = judged(&flags(case));
        assert_eq!(code, Some(0), "{case}: {r}");
        let big = &r["big_batch"]["comparison"];
        assert_eq!(big["right"], "big batch", "{case}: {r}");
        assert!(big["steps"].as_array().is_some_and(|s| !s.is_empty()), "{case}: {r}");
        let used = big["worst_fraction"].as_f64().unwrap();
        assert!(used <= 0.5, "{case}: the big batch used {used} of its allowance");
    }
}

/// Each bug is caught on the comparison that can see it, by a wide margin, with its cause.
#[test]
fn each_lm_bug_is_caught_with_its_own_cause() {
    let short = "--data-size 20 --batch-size 2 --acc-steps 4";
    let cases = [
        ("mean-per-micro-batch", "--model tiny-lm", "big_batch", "averaged over its own tokens"),
        ("count-per-rank", "--model tiny-lm", "runs", "all-reduce it before backward"),
        ("count-before-shift", "--model tiny-lm", "big_batch", "wrong number of tokens"),
        ("last-window-by-k", &format!("--model tiny-lm {short}"), "big_batch", "short window"),
        ("last-window-by-k", &format!("--partial-window step {short}"), "big_batch", "short window"),
    ];
    for (bug, case, which, cause) in cases {
        let args = format!("{case} --inject {bug}");
        let (code, r) = judged(&flags(&args));
        assert_eq!(code, Some(1), "{args}: {r}");
        let c = if which == "runs" { &r["runs"] } else { &r["big_batch"]["comparison"] };
        assert_eq!(c["verdict"], "diverged", "{args}: {which}: {r}");
        let margin = c["worst_fraction"].as_f64().unwrap();
        assert!(margin >= 100.0, "{args}: caught by only {margin}x its allowance");
        let out = ddp_verify(&flags(&args));
        assert!(stdout(&out).contains(cause), "{args}: {}", stdout(&out));
    }
    // Made alike by both runs, it is invisible between them: only the big batch shows it.
    let (_, r) = judged(&flags("--model tiny-lm --inject mean-per-micro-batch"));
    assert_ne!(r["runs"]["verdict"], "diverged", "{r}");
}

/// explore's fixed-seed sample of tiny-lm: honest cases within half their allowance, every
/// bug caught wherever it changes the math, by at least 100 times its allowance.
#[test]
fn explore_on_tiny_lm_has_no_false_alarm_and_catches_every_bug() {
    let tmp = tempfile::tempdir().unwrap();
    let reg = tmp.path().join("regressions.txt");
    let base = format!("explore --model tiny-lm --max-gpus 3 --regressions {} --json", reg.display());
    let out = ddp_verify(&flags(&format!("{base} --cases 30 --seed 3 --inject all")));
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_str(&text).expect("explore --json prints JSON");
    let tallies = report["tallies"].as_array().expect("tallies");
    use ddp_verify::spec::{Bug, ModelKind};
    for bug in Bug::ALL.iter().filter(|b| b.applies_to(ModelKind::TinyLm)) {
        let t = tallies.iter().find(|t| t["bug"] == bug.name()).unwrap_or_else(|| panic!("{bug:?}: {text}"));
        let n = |key: &str| t[key].as_u64().unwrap();
        assert_eq!((n("caught"), n("missed"), n("false_alarms")), (n("changes_math"), 0, 0), "{t}");
        assert!(n("caught") > 0, "{bug:?} never exercised: {t}");
        // JSON has no infinity: an infinite margin (a learning rate compared exactly) is null.
        assert!(t["min_margin"].as_f64().unwrap_or(f64::INFINITY) >= 100.0, "{t}");
    }
    let out = ddp_verify(&flags(&format!("{base} --cases 40 --seed 4")));
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_str(&text).expect("explore --json prints JSON");
    let honest = &report["tallies"][0];
    // Half the allowance exactly where DDP lands on the control's rounding; the bound
    // itself is float32 arithmetic for float32 runs, so "half" is good to a few 1e-8.
    assert!(honest["bug"].is_null() && honest["max_used"].as_f64().unwrap() <= 0.5 + 1e-6, "{honest}");
}

#[test]
fn what_tiny_lm_and_the_big_batch_cannot_do_is_refused_in_one_line() {
    let cases = [
        ("--model resnet-tiny --big-batch", "--big-batch"),
        ("--inject count-per-rank", "--inject"),
        ("--model tiny-lm --inject no-loss-scale", "--inject"),
        ("--model tiny-lm --dtype bfloat16", "--dtype"),
        ("--model tiny-lm --partial-window carry", "--partial-window"),
        ("--model tiny-lm --min-len 1", "--min-len"),
        ("--model tiny-lm --min-len 20", "--min-len"),
        ("--model tiny-lm --vocab 1", "--vocab"),
        ("explore --model linear --inject mean-per-micro-batch", "--inject"),
    ];
    for (case, flag) in cases {
        let out = ddp_verify(&flags(case));
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{case}: {err}");
        assert!(
            err.starts_with(&format!("ddp-verify: {flag}")) && err.trim_end().lines().count() == 1,
            "{case}: {err}"
        );
    }
}
