//! Automatic mixed precision: autocast forward passes over float32 weights, and
//! for float16 a GradScaler that unscales once per step after the all-reduce and skips a
//! step with inf/NaN on every rank and in accumulation alike.

use tch::Tensor;

use crate::util::{ddp_verify, flags, stderr, stdout};

/// Honest runs of every model under both autocast dtypes, two and three ranks: equivalent,
/// within half their allowance where DDP lands on the control's rounding.
#[test]
fn amp_runs_are_equivalent_within_half_the_allowance() {
    let cases = [
        ("--amp bfloat16 --acc-steps 4 --data-size 16 --batch-size 2 --epochs 3 --shuffle", 0.5),
        ("--amp float16 --init-scale 256 --growth-interval 2 --acc-steps 3 --gpus 3 --data-size 12 --batch-size 2", 0.5),
        ("--model tiny-lm --amp bfloat16 --optimizer adamw --acc-steps 4", 0.5),
        ("--model tiny-lm --amp float16 --acc-steps 6 --gpus 3 --clip-grad-norm 0.5", 0.5),
        ("--model resnet-tiny --amp bfloat16 --data-size 16 --max-steps 2", 1.0),
        ("--model resnet-tiny --amp float16 --init-scale 1024 --gpus 3 --acc-steps 3 --data-size 18 --batch-size 2 --max-steps 2", 1.0),
    ];
    for (case, most) in cases {
        let out = ddp_verify(&flags(&format!("{case} --report json")));
        let text = stdout(&out);
        assert_eq!(out.status.code(), Some(0), "{case}: {text}{}", stderr(&out));
        let report: serde_json::Value = serde_json::from_str(&text).unwrap();
        let used = report["runs"]["worst_fraction"].as_f64().unwrap();
        // The bound is float32 arithmetic: "half" is good to a few 1e-8.
        assert!(used <= most + 1e-6, "{case}: {used}");
    }
}

fn scalar(t: &[(String, Tensor)], name: &str) -> f64 {
    let (_, v) = t.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("{name} missing"));
    v.double_value(&[0])
}

/// One micro-batch of the last rank overflows at step 1: DDP's all-reduce carries the inf
/// to every rank, accumulation sums the same micro-batch, so both skip step 1 and halve the
/// scale, and every rank still holds rank 0's model.
#[test]
fn every_rank_and_accumulation_skip_the_overflowing_step_together() {
    let dir = tempfile::tempdir().unwrap();
    let save = dir.path().join("t");
    let case = format!(
        "--amp float16 --init-scale 1024 --overflow-step 1 --gpus 3 --acc-steps 3 --data-size 12 --batch-size 2 \
         --report json --save-trace {}",
        save.display()
    );
    let out = ddp_verify(&flags(&case));
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(report["runs"].get("rank_drift").is_none(), "{text}");
    assert_eq!(report["runs"]["steps"][1]["not_judged"], "both-skipped", "{text}");
    for run in ["accumulation", "ddp"] {
        let t = Tensor::read_safetensors(save.join(format!("{run}.safetensors"))).unwrap();
        let found: Vec<f64> = (0..4).map(|s| scalar(&t, &format!("found_inf.{s}"))).collect();
        let scales: Vec<f64> = (0..4).map(|s| scalar(&t, &format!("loss_scale.{s}"))).collect();
        assert_eq!(found, [0.0, 1.0, 0.0, 0.0], "{run}");
        assert_eq!(scales, [1024.0, 1024.0, 512.0, 512.0], "{run}");
    }
}

#[test]
fn each_loss_scaler_bug_is_caught_with_its_own_cause() {
    let cases = [
        (
            "--amp float16 --init-scale 1024 --inject unscale-per-micro-batch",
            "unscaled its gradients 2 times in step 0",
        ),
        (
            "--model tiny-lm --amp float16 --growth-interval 1 --acc-steps 4 --data-size 16 --inject scaler-update-per-micro-batch",
            "updated the loss scale 4 times in step 0",
        ),
    ];
    for (case, cause) in cases {
        let out = ddp_verify(&flags(case));
        let text = stdout(&out);
        assert_eq!(out.status.code(), Some(1), "{case}: {text}{}", stderr(&out));
        let line = text.lines().find(|l| l.starts_with("likely cause")).unwrap_or_else(|| panic!("{case}: {text}"));
        assert!(line.contains(cause), "{case}: {line}");
    }
}

/// A rank's loss share is W times accumulation's, so its scaled float16 values overflow
/// first: the accumulation run predicts that step from DDP's arithmetic, and the report
/// says what was not judged instead of a false alarm.
/// The saved traces carry the prediction (`range_part.<step>`), so `compare` judges them alike.
#[test]
fn float16s_range_parting_the_runs_is_reported_not_judged() {
    let dir = tempfile::tempdir().unwrap();
    let save = dir.path().join("t").display().to_string();
    let run = ddp_verify(&flags(&format!("--amp float16 --epochs 4 --data-size 16 --save-trace {save}")));
    let compared = ddp_verify(&["compare", &save]);
    for out in [run, compared] {
        let text = stdout(&out);
        assert_eq!(out.status.code(), Some(0), "{text}{}", stderr(&out));
        let verdict = text.lines().find(|l| l.starts_with("EQUIVALENT")).unwrap();
        assert!(verdict.contains("float16's range parted the loss scalers at step 1"), "{verdict}");
        assert!(verdict.contains("nothing from step 1 on, final weights included, was judged"), "{verdict}");
    }
}

#[test]
fn amp_flags_out_of_range_are_refused_in_one_line() {
    let cases = [
        ("--amp float8", "--amp"),
        ("--amp float16 --dtype bfloat16", "--amp"),
        ("--amp bfloat16 --init-scale 8", "--init-scale"),
        ("--amp float16 --init-scale 0", "--init-scale"),
        ("--amp float16 --growth-interval 0", "--growth-interval"),
        ("--overflow-step 0", "--overflow-step"),
        ("--amp float16 --overflow-step 2", "--overflow-step"),
        ("--amp bfloat16 --big-batch", "--big-batch"),
        ("--amp bfloat16 --inject unscale-per-micro-batch", "--inject"),
        ("--inject scaler-update-per-micro-batch", "--inject"),
        ("--amp bfloat16 --device cuda", "--"),
    ];
    for (case, flag) in cases {
        let out = ddp_verify(&flags(case));
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{case}: {err}");
        assert!(err.contains(flag) && err.trim_end().lines().count() <= 2, "{case}: {err}");
    }
}
