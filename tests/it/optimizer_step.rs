//! What happens at the optimizer step: AdamW, clipping and schedules stay
//! equivalent, and each optimizer-step bug is caught with its own cause.

use crate::util::{ddp_verify, flags, stderr, stdout};

/// Honest runs with every option at once, in both models that have a big batch, and
/// three ranks: equivalent, within half their allowance.
#[test]
fn adamw_clipping_and_schedules_are_equivalent_within_half_the_allowance() {
    let cases = [
        "--optimizer adamw --weight-decay 0.01 --lr-schedule warmup:3 --clip-grad-norm 0.5 --acc-steps 4 --data-size 16 --batch-size 2 --epochs 3 --shuffle",
        "--lr-schedule cosine:3 --clip-grad-norm 0.3 --acc-steps 3 --gpus 3 --data-size 12 --batch-size 2 --epochs 2",
        "--model tiny-lm --optimizer adamw --clip-grad-norm 1.0 --lr-schedule cosine:4 --acc-steps 4",
        "--model tiny-lm --optimizer adamw --acc-steps 6 --gpus 3 --lr 0.01",
    ];
    for case in cases {
        let out = ddp_verify(&flags(&format!("{case} --report json")));
        let text = stdout(&out);
        assert_eq!(out.status.code(), Some(0), "{case}: {text}{}", stderr(&out));
        let report: serde_json::Value = serde_json::from_str(&text).unwrap();
        let used = report["runs"]["worst_fraction"].as_f64().unwrap();
        // Half exactly where DDP lands on the control's rounding; the bound is float32
        // arithmetic for float32 runs, so "half" is good to a few 1e-8.
        assert!(used <= 0.5 + 1e-6, "{case}: {used}");
    }
}

#[test]
fn each_optimizer_step_bug_is_caught_with_its_own_cause() {
    let base = "--acc-steps 4 --data-size 16 --batch-size 2 --epochs 3 --shuffle";
    let cases = [
        ("--clip-grad-norm 0.5 --inject clip-per-micro-batch", "clipped its gradients 4 times in step 0"),
        ("--lr-schedule warmup:3 --inject schedule-per-micro-batch", "at step 1"),
        ("--optimizer adamw --inject adamw-no-loss-scale", "under AdamW the weights barely show it"),
        ("--model tiny-lm --optimizer adamw --clip-grad-norm 0.1 --inject clip-per-micro-batch", "times in step 0"),
        ("--model tiny-lm --dropout 0.1 --inject dropout-same-seed", "drew step 0's dropout masks from different keys"),
    ];
    for (case, cause) in cases {
        let out = ddp_verify(&flags(&format!("{base} {case}")));
        let text = stdout(&out);
        assert_eq!(out.status.code(), Some(1), "{case}: {text}{}", stderr(&out));
        let line = text.lines().find(|l| l.starts_with("likely cause")).unwrap_or_else(|| panic!("{case}: {text}"));
        assert!(line.contains(cause), "{case}: {line}");
    }
}

#[test]
fn optimizer_flags_out_of_range_are_refused_in_one_line() {
    let cases = [
        ("--optimizer adam", "--optimizer"),
        ("--betas 0.9 1.0", "--betas"),
        ("--eps 0", "--eps"),
        ("--clip-grad-norm -1", "--clip-grad-norm"),
        ("--lr-schedule warmup:0", "--lr-schedule"),
        ("--lr-schedule linear", "--lr-schedule"),
        ("--inject adamw-no-loss-scale", "--inject"),
        ("--inject clip-per-micro-batch", "--inject"),
        ("--inject schedule-per-micro-batch", "--inject"),
        ("--dropout 0.1", "--dropout"),
        ("--model tiny-lm --dropout 1", "--dropout"),
        ("--model tiny-lm --dropout=-0.1", "--dropout"),
        ("--model tiny-lm --inject dropout-same-seed", "--inject"),
    ];
    for (case, flag) in cases {
        let out = ddp_verify(&flags(case));
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{case}: {err}");
        assert!(err.contains(flag) && err.trim_end().lines().count() <= 2, "{case}: {err}");
    }
}

/// A parameter left out of the all-reduce is named with the rank and the step it parts at,
/// on every model; honest runs of 3 to 8 ranks never show a rank apart.
#[test]
fn every_rank_holds_rank_0s_model_and_an_unsynced_parameter_is_named() {
    let cases = [
        ("--gpus 3 --acc-steps 3", "param linear.weight"),
        ("--model tiny-lm --gpus 3 --acc-steps 3", "param head.weight"),
        ("--model resnet-tiny --gpus 3 --acc-steps 3 --data-size 18 --batch-size 2 --max-steps 2", "param fc.bias"),
    ];
    for (case, tensor) in cases {
        let out = ddp_verify(&flags(&format!("{case} --inject unsynced-param")));
        let text = stdout(&out);
        assert_eq!(out.status.code(), Some(1), "{case}: {text}{}", stderr(&out));
        let want = format!("NOT EQUIVALENT: DDP rank 1 held another {tensor} than rank 0 after step 0");
        assert!(text.contains(&want), "{case}: {text}");
        assert!(text.contains("likely cause: after step 0 DDP rank 1"), "{case}: {text}");
    }
    for case in [
        "--gpus 8 --acc-steps 8 --data-size 32 --batch-size 1",
        "--model tiny-lm --gpus 4 --acc-steps 4 --optimizer adamw",
    ] {
        let out = ddp_verify(&flags(case));
        assert_eq!(out.status.code(), Some(0), "{case}: {}{}", stdout(&out), stderr(&out));
    }
}
