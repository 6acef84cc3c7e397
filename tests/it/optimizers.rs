//! Every optimizer recorded at its own step (`tests/optimizers/two.py`: a learned temperature
//! outside the model, stepped by an optimizer of its own after the script all-reduces its
//! gradients by hand, between the model's step and its own).

use crate::util::{repo, stdout, users};

/// `ddp-verify --acc-steps 4 --gpus 2 -- torchrun --nproc-per-node 2 two.py ARGS`: the exit
/// code and the JSON report.
fn run(args: &str) -> (Option<i32>, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("report.json");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ddp-verify"))
        .args(["--acc-steps", "4", "--gpus", "2", "--report", "json", "--force", "--report-file"])
        .arg(&report)
        .arg("--save-trace")
        .arg(dir.path().join("traces"))
        .args(["--", &users("torchrun"), "--nproc-per-node", "2"])
        .arg(repo("tests/optimizers/two.py"))
        .args(["--accum", "{local_acc_steps}"])
        .args(args.split_whitespace())
        .current_dir(dir.path())
        .output()
        .expect("ddp-verify runs");
    let text = std::fs::read_to_string(&report).unwrap_or_else(|e| {
        panic!("{e}: {}{}", stdout(&out), String::from_utf8_lossy(&out.stderr));
    });
    (out.status.code(), serde_json::from_str(&text).unwrap())
}

/// Recorded at the model's step, the temperature's gradients were each rank's own, not yet
/// reduced: the honest run was NOT EQUIVALENT at 4.8e5x the allowance (and its step 0 was
/// missing). Recorded as its own step finds them, it is EQUIVALENT; never reduced, the ranks
/// step it apart, named at the update.
#[test]
fn a_second_optimizer_is_recorded_at_its_own_step() {
    let (code, honest) = run("");
    assert_eq!(code, Some(0), "{honest}");
    let (code, bug) = run("--bug never-reduced");
    assert_eq!((code, bug["diagnosis"]["stage"].as_str()), (Some(1), Some("update")), "{bug}");
    assert!(bug["diagnosis"]["detail"].as_str().unwrap_or_default().contains("optimizer1.0.0"), "{bug}");
}
