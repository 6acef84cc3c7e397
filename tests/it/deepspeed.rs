//! DeepSpeed ZeRO, unmodified scripts: `ddp-verify --acc-steps 4 --gpus 2 -- python
//! examples/deepspeed/train.py --grad-accum 4 --stage S` (and Transformers' Trainer given a
//! DeepSpeed config). The recorder reads the whole gradients and weights from the ranks'
//! partitions in the hooks of DeepSpeed's inner optimizer; each verdict with its cause.

use crate::user_loops::{caught, reason, zero_edit, zero_edit_with};
use crate::util::repo;

/// Both traces say the engine, its gradient_accumulation_steps (K in one process, K/W per
/// rank) and the framework that called the step.
fn engine_said(report: &serde_json::Value, engine: &str, framework: &str) {
    for (side, gas) in [("left", "4"), ("right", "2")] {
        let meta = &report["traces"][side]["meta"];
        assert_eq!(
            (meta["engine"].as_str(), meta["engine_accumulation"].as_str(), meta["framework"].as_str()),
            (Some(engine), Some(gas), Some(framework)),
            "{side}: {report}"
        );
    }
}

/// DeepSpeed averages over the ranks and divides by its accumulation steps, as one process
/// accumulating K does: ZeRO 1 and 3 under `python`, ZeRO 2 with the DDP leg's launcher
/// given as torchrun (one test each, so that the two test threads share them out).
fn honest(stage: u32, launcher: Option<&[&str]>) {
    let extra = format!("--grad-accum {{acc_steps}} --stage {stage}");
    let (code, honest) = match launcher {
        Some(l) => zero_edit_with(l, "deepspeed", &extra),
        None => zero_edit("deepspeed", &extra),
    };
    assert_eq!((code, reason(&honest)), (Some(0), "none"), "stage {stage}: {honest}");
    engine_said(&honest, &format!("deepspeed-zero{stage}"), "deepspeed");
}

#[test]
fn zero_1_honest_is_equivalent() {
    honest(1, None);
}

#[test]
fn zero_2_honest_under_torchrun_is_equivalent() {
    let torchrun = repo(".venv/bin/torchrun").display().to_string();
    honest(2, Some(&[&torchrun, "--nproc_per_node", "2"]));
}

#[test]
fn zero_3_honest_is_equivalent() {
    honest(3, None);
}

/// open-instruct PR 1498: gradient_accumulation_steps=1 with K/W engine.backward calls per
/// engine.step(): every backward is a boundary, the earlier micro-batches are lost.
#[test]
fn zero_reset_every_backward_is_the_engine_boundary() {
    caught(
        "deepspeed",
        "--grad-accum {acc_steps} --stage 2 --bug reset-every-backward",
        "engine accumulation boundary",
        Some("gradient_accumulation_steps=1"),
    );
}

/// A loss divided by the local micro-batches by hand, on top of engine.backward's own division.
#[test]
fn zero_loss_divided_twice_is_loss_scaling_naming_deepspeed() {
    caught(
        "deepspeed",
        "--grad-accum {acc_steps} --stage 2 --bug loss-divided-twice",
        "loss scaling",
        Some("DeepSpeed's engine.backward (gradient_accumulation_steps) already divides"),
    );
}

/// Transformers' Trainer with TrainingArguments(deepspeed=ZeRO-2): recorded through the same
/// inner optimizer, the framework named Transformers.
#[test]
fn trainer_under_zero_2_honest_is_equivalent() {
    let (code, honest) = zero_edit("transformers", "--grad-accum {local_acc_steps} --deepspeed 2");
    assert_eq!(code, Some(0), "{honest}");
    engine_said(&honest, "deepspeed-zero2", "transformers");
}
