//! Low precision on a loop written apart from the examples (`tests/precision/loop.py`: a
//! strided `DistributedSampler` against one process's consecutive batches, Adam, no
//! clipping), in two runs and in `watch`: each precision held to its measured rounding, and
//! its small bugs caught at their stages by the facts (docs/mixed-precision.md).

use std::path::Path;

use crate::util::{repo, stdout, users};

/// `ddp-verify --acc-steps 2W --gpus W -- torchrun --nproc-per-node W loop.py --accum
/// {local_acc_steps} ARGS` (or `watch --` it at two micro-batches per rank) in `dir`: the exit
/// code and the JSON report.
fn run(dir: &Path, watch: bool, w: usize, args: &str) -> (Option<i32>, serde_json::Value) {
    let report = dir.join("report.json");
    let (k, w) = ((2 * w).to_string(), w.to_string());
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_ddp-verify"));
    match watch {
        true => cmd.arg("watch"),
        false => cmd.args(["--acc-steps", &k, "--gpus", &w]),
    };
    cmd.args(["--report", "json", "--force", "--report-file"])
        .arg(&report)
        .arg("--save-trace")
        .arg(dir.join("traces"))
        .args(["--", &users("torchrun"), "--nproc-per-node", &w])
        .arg(repo("tests/precision/loop.py"))
        .args(["--accum", if watch { "2" } else { "{local_acc_steps}" }])
        .args(args.split_whitespace())
        .current_dir(dir);
    let out = cmd.output().expect("ddp-verify runs");
    let text = std::fs::read_to_string(&report).unwrap_or_else(|e| {
        panic!("{e}: {}{}", stdout(&out), String::from_utf8_lossy(&out.stderr));
    });
    (out.status.code(), serde_json::from_str(&text).unwrap())
}

fn stage(report: &serde_json::Value) -> Option<&str> {
    report["diagnosis"]["stage"].as_str()
}

/// Honest runs where the legs round otherwise at a power-of-two W: the same samples regrouped
/// under bfloat16 autocast (float32's tolerance was a false alarm at 192x), and FSDP2's
/// bfloat16 compute and reduce-scatter. A control at divisor 3 measures that rounding, the
/// final weights by its own; no fixed multiple of bfloat16's epsilon is left.
#[test]
fn regrouped_and_engine_bf16_runs_at_w2_are_held_to_a_control_at_divisor_3() {
    for args in ["--precision bf16-autocast", "--precision fsdp2-bf16 --reduce bf16"] {
        let dir = tempfile::tempdir().unwrap();
        let (code, report) = run(dir.path(), false, 2, args);
        assert_eq!(code, Some(0), "{args}: {report}");
        let held = &report["traces"]["precision"];
        assert_eq!((held["divisor"].as_f64(), held["dtype"].as_str()), (Some(3.0), Some("bfloat16")), "{report}");
        assert!(report["runs"]["worst_fraction"].as_f64().unwrap() < 0.75, "{args}: {report}");
    }
}

/// Pure bfloat16 weights (gradients and Adam's state too) at W=3: honest within its measured
/// rounding; a loss x1.03 on the ranks is named at the scaling stage by its recorded weight,
/// though a bfloat16 loss rounds that weight at 2^-7.
#[test]
fn bf16_weights_at_w3_are_held_to_their_measured_rounding_and_a_loss_factor_is_a_fact() {
    let dir = tempfile::tempdir().unwrap();
    let (code, report) = run(dir.path(), false, 3, "--precision bf16-weights");
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(report["traces"]["left"]["meta"]["loss_dtype"].as_str(), Some("bfloat16"), "{report}");
    let (code, report) = run(dir.path(), false, 3, "--precision bf16-weights --bug loss-x1.03");
    assert_eq!((code, stage(&report)), (Some(1), Some("scaling")), "{report}");
    let fact = &report["runs"]["fact"];
    assert!((fact["ratio"].as_f64().unwrap() - 1.03).abs() < 2e-3 && fact["times"].as_f64().unwrap() > 1.0, "{report}");
}

/// Small bugs at W=3, each at its stage: under bfloat16 autocast a loss x1.03 on the ranks
/// (the loss float32: its weight 15 times its rounding), a rank without the others' autocast
/// (the precision stage, from each micro-batch's recorded autocast); under float16 with a
/// GradScaler, label smoothing on the ranks (the regrouped step's mean loss at step 0); under
/// FSDP2's bfloat16, the loss x1.03.
#[test]
fn small_precision_bugs_at_w3_are_caught_at_their_stages() {
    let dir = tempfile::tempdir().unwrap();
    for (args, want) in [
        ("--precision bf16-autocast --bug loss-x1.03", "scaling"),
        ("--precision bf16-autocast --bug rank-autocast", "precision"),
        ("--precision fp16-scaler --bug label-smoothing", "loss"),
        ("--precision fsdp2-bf16 --bug loss-x1.03", "scaling"),
    ] {
        let (code, report) = run(dir.path(), false, 3, args);
        assert_eq!((code, stage(&report)), (Some(1), Some(want)), "{args}: {report}");
        if args == "--precision bf16-autocast --bug loss-x1.03" {
            assert_eq!(report["traces"]["right"]["meta"]["loss_dtype"].as_str(), Some("float32"), "{report}");
            assert!(report["runs"]["fact"]["times"].as_f64().unwrap() >= 4.0, "{report}");
        }
    }
}

/// float16 with a GradScaler starting at 2^24: its first steps overflow and skip, and a DDP
/// rank, whose scaled values are W times one process's, skips where one process does not
/// (float16's range, which was a false alarm "skipped ... owned by your script", and before it
/// an exit 2 on the skipped steps' infinite magnitudes). The precision control, at DDP's
/// divisor just off a power of two, skips as DDP does: the parting is predicted, and the
/// steps from it not judged.
#[test]
fn float16s_range_parting_the_loss_scalers_is_predicted_by_the_control() {
    let dir = tempfile::tempdir().unwrap();
    let (code, report) = run(dir.path(), false, 2, "--precision fp16-scaler --init-scale 16777216");
    assert_eq!(code, Some(0), "{report}");
    assert!(report["runs"]["range_parted"]["steps"].as_array().is_some_and(|s| !s.is_empty()), "{report}");
    assert_eq!(report["traces"]["precision"]["divisor"].as_f64(), Some(2.0625), "{report}");
}

/// `watch` on one run: an honest float16 + GradScaler run keeps every contract (the scale is
/// not the script's scaling), and a rank that enters no autocast breaks the precision contract.
#[test]
fn watch_holds_the_ranks_to_one_precision() {
    let dir = tempfile::tempdir().unwrap();
    let (code, report) = run(dir.path(), true, 3, "--precision fp16-scaler");
    assert_eq!(code, Some(0), "{report}");
    let (code, report) = run(dir.path(), true, 3, "--precision bf16-autocast --bug rank-autocast");
    let fault = report["fault"]["diagnosis"]["stage"].as_str();
    assert_eq!((code, fault), (Some(1), Some("precision")), "{report}");
}
