//! Sharded data parallelism against accumulation, on users' unmodified scripts: FSDP2
//! (`fully_shard` over gloo on the CPU), honest and with the bugs its users hit, and the
//! price of reducing every micro-batch's gradients (seed 002) under DDP and FSDP2.

use std::process::Command;

use crate::user_loops::{caught, zero_edit};
use crate::util::{repo, stderr, stdout};

const FSDP2: &str = "--grad-accum {acc_steps}";

/// Each rank holds a shard; the recorder gathers the whole gradients and weights, reads
/// FSDP2's per-backward reduce flags, and the verdict is the plain model's.
#[test]
fn fsdp2_honest_is_equivalent_and_reduces_once_per_step() {
    let (code, r) = zero_edit("fsdp2", FSDP2);
    assert_eq!(code, Some(0), "{r}");
    assert_eq!(r["traces"]["right"]["meta"]["engine"], "fsdp2", "{r}");
    assert_eq!(r["traces"]["right"]["meta"]["grad_divide"], "2.0", "{r}");
    let ddp = &r["traces"]["cost"][1];
    // K=4 over 2 ranks: two backwards per rank, the last one reduce-scatters (4 groups).
    assert_eq!((ddp["micro_batches"].as_u64(), ddp["reduced"].as_u64()), (Some(2), Some(1)), "{r}");
    assert_eq!(ddp["collectives"].as_f64(), Some(4.0), "{r}");
    assert!(r["caution"].is_null(), "{r}");
    // No compute dtype recorded: float32's own tolerance.
    assert_eq!(r["tolerance"]["rtol"].as_f64(), Some(1e-6), "{r}");
}

/// pytorch#162338's sum (here by set_gradient_divide_factor(1.0)), and the sync switch
/// turned off and never back on: each named from what the recorder read of FSDP2.
#[test]
fn fsdp2_bugs_are_named() {
    caught(
        "fsdp2",
        &format!("{FSDP2} --bug divide-factor-sum"),
        "summed over ranks",
        Some("gradients are 2x: summed over ranks, not averaged"),
    );
    caught(
        "fsdp2",
        &format!("{FSDP2} --bug sync-never-on"),
        "unsynchronised gradient",
        Some("set_requires_gradient_sync(False) was on through the last backward"),
    );
}

/// MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32) against the one
/// process under bfloat16 autocast: the legs reach bfloat16 otherwise (other ops run narrow),
/// so each leg's rounding is measured by a control of its own at divisor 3 (W=2 rounds
/// alike, these do not); no fixed multiple of bfloat16's epsilon (it was 6.5%, 0.05-0.11 of
/// it used) is left, float32's tolerance under the measured part.
#[test]
fn fsdp2_bfloat16_mixed_precision_is_held_to_both_legs_measured_rounding() {
    let (code, r) = zero_edit("fsdp2", &format!("{FSDP2} --bf16"));
    assert_eq!(code, Some(0), "{r}");
    assert_eq!(r["traces"]["right"]["meta"]["compute_dtype"], "bfloat16", "{r}");
    let held = &r["traces"]["precision"];
    assert_eq!((held["divisor"].as_f64(), held["both"].as_bool()), (Some(3.0), Some(true)), "{r}");
    assert!(r["runs"]["worst_fraction"].as_f64().unwrap() < 0.75, "{r}");
    assert_eq!(r["tolerance"]["rtol"].as_f64(), Some(1e-6), "float32's: {r}");
}

/// Seed 002: a loop that never skips the reduction is right and K/W times as chatty; the
/// verdict stands and a caution says what it costs, under DDP and under FSDP2.
#[test]
fn reducing_every_micro_batch_is_equivalent_with_a_caution() {
    for (example, fix) in [("nanogpt", "no_sync()"), ("fsdp2", "set_requires_gradient_sync(False)")] {
        let (code, r) = zero_edit(example, "--grad-accum {acc_steps} --always-sync");
        assert_eq!((code, r["caution"]["reason"].as_str()), (Some(0), Some("needless synchronisation")), "{r}");
        let says = r["caution"]["detail"].as_str().unwrap();
        assert!(says.contains("1 of the 2 micro-batches per rank were all-reduced needlessly"), "{says}");
        assert!(says.contains(fix) && says.contains(" per step;") && says.contains("measured time per step"), "{says}");
    }
}

/// A sampled FSDP2 trace: each rank gathers only the kept positions it owns and its
/// shards' sums; the honest run stays equivalent (the bugs are named from recorded facts,
/// sampled or not).
#[test]
fn fsdp2_sampled_traces_give_the_same_verdicts() {
    let t = tempfile::tempdir().unwrap();
    let report = t.path().join("r.json");
    let out = Command::new(env!("CARGO_BIN_EXE_ddp-verify"))
        .args(["--acc-steps", "4", "--gpus", "2", "--sample", "16", "--report", "json", "--report-file"])
        .arg(&report)
        .arg("--")
        .arg(repo(".venv/bin/python"))
        .arg(repo("examples/fsdp2/train.py"))
        .args(FSDP2.split_whitespace())
        .output()
        .unwrap();
    let text = std::fs::read_to_string(&report).unwrap_or_else(|e| panic!("{e}: {}{}", stdout(&out), stderr(&out)));
    let r: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(out.status.code(), Some(0), "{r}");
    assert_eq!(r["traces"]["sampling"]["size"], 16, "{r}");
}

/// FSDP2 at W=3, K=9, B=3, N=82 (explore's draw): EQUIVALENT. Its later steps may part
/// beyond one step's tolerance as AdamW amplifies the reduction's rounding, with no recorded
/// fact apart (on this 2-core machine one run parted at step 2 by 2.6e-6, another stayed
/// within at 1.0e-6: gloo's three ranks do not reduce in one order every run); where they
/// do, a control run proves it rounding (the caution says so), `compare` of the two traces
/// without it is NOT EQUIVALENT asking for one, and with it (or the folder that holds it)
/// equivalent.
#[test]
fn fsdp2_at_w3_amplified_rounding_is_proven_by_a_control_run() {
    let t = tempfile::tempdir().unwrap();
    let (dir, report) = (t.path().join("traces"), t.path().join("r.json"));
    let (dir_s, report_s) = (dir.display().to_string(), report.display().to_string());
    let (py, script) =
        (repo(".venv/bin/python").display().to_string(), repo("examples/fsdp2/train.py").display().to_string());
    let mut args = crate::util::flags("--acc-steps 9 --gpus 3 --batch-size 3 --report json --report-file");
    args.extend([report_s.as_str(), "--save-trace", dir_s.as_str(), "--", py.as_str(), script.as_str()]);
    args.extend(crate::util::flags("--grad-accum {acc_steps} --samples 82 --batch {batch}"));
    let out = crate::util::ddp_verify(&args);
    let r = crate::util::json_file(&report_s);
    assert_eq!(out.status.code(), Some(0), "{r}{}", stderr(&out));
    let parted = r["runs"]["steps"].as_array().unwrap().iter().any(|s| s["verdict"] == "diverged");
    if !parted {
        assert!(r["caution"].is_null() && !stderr(&out).contains("the control leg"), "{r}");
        return;
    }
    assert_eq!(r["caution"]["reason"], "chaos", "{r}");
    assert!(stderr(&out).contains("the control leg"), "{}", stderr(&out));
    let file = |name: &str| dir.join(name).display().to_string();
    let (acc, ddp, control) = (file("accumulation.safetensors"), file("ddp.safetensors"), file("control.safetensors"));
    let json = t.path().join("compare.json").display().to_string();
    let without = crate::util::ddp_verify(&["compare", &acc, &ddp, "--report", "json", "--report-file", &json]);
    let c = crate::util::json_file(&json);
    assert_eq!(
        (without.status.code(), c["diagnosis"]["reason"].as_str()),
        (Some(1), Some("unexplained difference")),
        "{c}"
    );
    assert!(c["diagnosis"]["detail"].as_str().unwrap().contains("no control run"), "{c}");
    let with = crate::util::ddp_verify(&["compare", &acc, &ddp, "--control", &control]);
    assert_eq!(with.status.code(), Some(0), "{}", stdout(&with));
    let by_folder = crate::util::ddp_verify(&["compare", &dir_s]);
    assert_eq!(by_folder.status.code(), Some(0), "{}", stdout(&by_folder));
}
