//! How much difference is allowed, as properties: equivalent runs pass with room to spare, whatever
//! W, dtype or model, and planted bugs exceed what was allowed by far. Properties, not
//! examples: DDP replays the control's rounding, so a correct run uses at most half of its
//! allowance (the bound is twice what rounding explains).

use crate::util::{ddp_verify, flags, stderr, stdout};

/// Runs ddp-verify with a JSON report; (exit code, the accumulation-vs-DDP comparison).
fn judged(args: &[&str]) -> (Option<i32>, serde_json::Value) {
    let mut all = args.to_vec();
    all.extend(["--report", "json"]);
    let out = ddp_verify(&all);
    let text = stdout(&out);
    let v: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{args:?}: {e}: {text}{}", stderr(&out)));
    (out.status.code(), v["runs"].clone())
}

fn used(c: &serde_json::Value) -> f64 {
    c["worst_fraction"].as_f64().unwrap()
}

#[test]
fn resnets_with_three_or_more_ranks_are_equivalent_in_every_dtype() {
    let mut cases = vec![
        // A configuration once found NOT EQUIVALENT under a fixed 16 ulp (12-33 ulp differences).
        "--acc-steps 6 --gpus 6 --batch-size 3 --data-size 72 --momentum 0.9 --weight-decay 5e-4 --epochs 2 --seed 6 --max-steps 3".to_string(),
        "--acc-steps 5 --gpus 5 --batch-size 2 --data-size 20 --image-size 16".to_string(),
    ];
    for dtype in ["float64", "bfloat16", "float16"] {
        cases.push(format!(
            "--acc-steps 6 --gpus 3 --batch-size 2 --data-size 30 --weight-decay 1e-3 --image-size 16 --shuffle --max-steps 3 --dtype {dtype}"
        ));
    }
    for case in &cases {
        let args: Vec<&str> = ["--model", "resnet-tiny"].into_iter().chain(flags(case)).collect();
        let (code, c) = judged(&args);
        assert_eq!(code, Some(0), "{args:?}: {c}");
        assert_eq!(c["derived"], true, "{args:?}");
        assert!(used(&c) <= 0.5 + 1e-9, "{args:?}: used {} of the allowance", used(&c));
    }
}

#[test]
fn the_linear_model_uses_at_most_half_its_allowance_too() {
    for (w, dtype) in [(3, "float32"), (5, "bfloat16"), (7, "float16"), (2, "float64")] {
        let case = format!("--gpus {w} --acc-steps {} --data-size 37 --batch-size 3 --shuffle --dtype {dtype}", 2 * w);
        let (code, c) = judged(&flags(&case));
        assert_eq!(code, Some(0), "{case}: {c}");
        assert!(used(&c) <= 0.5 + 1e-9, "{case}: used {}", used(&c));
    }
}

/// The discrimination margin: a planted bug's worst difference over what was allowed.
#[test]
fn planted_bugs_exceed_their_allowance_a_hundredfold_in_narrow_dtypes() {
    for dtype in ["bfloat16", "float16"] {
        for bug in ["no-loss-scale", "double-scale", "contiguous-split", "stale-zero-grad"] {
            let case = format!(
                "--model resnet-tiny --acc-steps 6 --gpus 3 --batch-size 3 --data-size 27 --image-size 16 --epochs 2 --shuffle --dtype {dtype} --inject {bug}"
            );
            let (code, c) = judged(&flags(&case));
            assert_eq!(code, Some(1), "{case}");
            assert!(used(&c) >= 100.0, "{case}: margin only {}", used(&c));
        }
    }
}

/// An explicit tolerance still overrides, and a divergence it alone causes is named so.
#[test]
fn an_explicit_tolerance_overrides_the_derived_bound_and_says_so() {
    let case =
        "--acc-steps 6 --gpus 3 --data-size 37 --batch-size 3 --shuffle --features 64 --max-ulps 0 --rtol 0 --atol 0";
    let out = ddp_verify(&flags(case));
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("explicit tolerance (0 ulp) is tighter than the arithmetic allows"), "{text}");
    let (code, c) = judged(&flags(&case.replace("--max-ulps 0 --rtol 0 --atol 0", "")));
    assert_eq!((code, &c["derived"]), (Some(0), &serde_json::Value::Bool(true)), "{c}");
}

#[test]
fn fewer_samples_than_ranks_pads_by_repetition_as_torch_does() {
    let (code, c) = judged(&flags("--data-size 3 --gpus 5 --acc-steps 5 --batch-size 1"));
    assert_eq!(code, Some(0), "{c}");
    let out = ddp_verify(&flags("split --data-size 3 --gpus 5 --acc-steps 5 --batch-size 1"));
    assert!(stdout(&out).contains("rank 3: [0]\n  rank 4: [1]"), "{}", stdout(&out));
    let out = ddp_verify(&flags("--data-size 3 --gpus 5 --acc-steps 5 --drop-last"));
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).starts_with("ddp-verify: --drop-last:"), "{}", stderr(&out));
}

/// CI's fixed-seed sample of explore on resnet-tiny: no false alarm, every bug caught with a
/// margin of at least 100.
#[test]
fn explore_on_resnets_has_no_false_alarm_and_catches_every_bug() {
    let tmp = tempfile::tempdir().unwrap();
    let reg = tmp.path().join("regressions.txt");
    let base = format!("explore --model resnet-tiny --max-gpus 4 --regressions {}", reg.display());
    let out = ddp_verify(&flags(&format!("{base} --cases 16 --seed 2")));
    assert_eq!(out.status.code(), Some(0), "{}{}", stdout(&out), stderr(&out));
    let out = ddp_verify(&flags(&format!("{base} --cases 12 --seed 7 --inject all --json")));
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_str(&text).expect("explore --json prints JSON");
    let tallies = report["tallies"].as_array().expect("tallies");
    use ddp_verify::spec::{Bug, ModelKind};
    let bugs: Vec<&str> = Bug::ALL.iter().filter(|b| b.applies_to(ModelKind::ResnetTiny)).map(|b| b.name()).collect();
    // Each bug's margin: the smallest factor by which a caught case exceeded its allowance.
    let mut margins = 0;
    for t in tallies.iter().filter(|t| bugs.iter().any(|b| t["bug"] == *b)) {
        // JSON has no infinity: an infinite margin (a learning rate compared exactly) is null.
        if t["caught"].as_u64().unwrap_or(0) > 0 {
            assert!(t["min_margin"].as_f64().unwrap_or(f64::INFINITY) >= 100.0, "{t}");
            margins += 1;
        }
    }
    assert_eq!(margins, bugs.len(), "every bug caught somewhere, with its margin: {text}");
}
