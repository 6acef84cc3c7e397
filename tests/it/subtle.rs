//! examples/subtle: a plain float32 DDP loop (11 Linear layers, AdamW or RMSprop) with small
//! real mistakes that make one process with K micro-batches and W DDP ranks train differently
//! (weight decay, schedules, frozen layers, parameters outside DDP, EMA, clipping, the loss's
//! normaliser), each beside its honest twin: `--bug none` with the same other flags. No bug
//! passes as EQUIVALENT, each is named by the fact that parts the runs (never "chaos"), and
//! no twin is a false alarm.
//! `bench/subtle.py` runs the same matrix and prints each case's verdict and cause.

use crate::user_loops::{reason, zero_edit};

/// Each bug with the flags its honest twin shares (the setting it is a mistake in); the same
/// list as bench/subtle.py's.
const BUGS: &[(&str, &str)] = &[
    ("wd-local-batch", "--scale-wd-to 16"),
    ("rank-no-wd", ""),
    ("group1-warmup-per-micro", "--head-warmup 8"),
    ("unfreeze-after-ddp", "--freeze-until 1"),
    ("uncertainty-outside-ddp", "--loss-weights learned"),
    ("ema-per-micro", "--ema 0.9"),
    ("clip-per-rank-manual-allreduce", "--sync manual --clip 0.05"),
    ("wd-per-micro", "--wd-by-hand"),
    ("per-rank-normaliser", "--normaliser step"),
];

/// The cause each bug must be named by: the recorded fact that parts the runs (a setting, a
/// rank's weights, an unreduced gradient, the clip's norm, the losses at step 0, each rank's
/// normaliser) or, where only the final weights part, the optimizer's step (AdamW's carried
/// bound) or a difference a control run refutes as rounding (RMSprop, which carries none).
fn cause(bug: &str, optimizer: &str) -> &'static str {
    match (bug, optimizer) {
        ("wd-local-batch" | "group1-warmup-per-micro", _) => "optimizer settings",
        ("rank-no-wd" | "uncertainty-outside-ddp", _) => "ranks differ",
        ("unfreeze-after-ddp", _) => "unsynchronised gradient",
        ("ema-per-micro", "rmsprop") => "unexplained difference",
        ("ema-per-micro", _) => "optimizer step",
        ("clip-per-rank-manual-allreduce", _) => "gradient clipping",
        ("wd-per-micro", _) => "different gradients",
        ("per-rank-normaliser", _) => "token count per rank",
        _ => "unknown bug",
    }
}

/// The bugs also run at a fine-tuning learning rate, where each step moves the weights little.
const FINE_TUNING: &[&str] = &["wd-local-batch", "rank-no-wd", "ema-per-micro", "wd-per-micro", "per-rank-normaliser"];

fn args(optimizer: &str, lr: &str, setting: &str, bug: &str) -> String {
    format!("--grad-accum {{local_acc_steps}} --optimizer {optimizer} --lr {lr} {setting} --bug {bug}")
}

/// The cases among `bugs` judged wrong, each with its verdict and cause: with `twins`, each
/// honest twin (once per setting) not EQUIVALENT; with `caught`, each bug not NOT EQUIVALENT
/// or named by another cause than [`cause`]'s.
fn wrong(optimizer: &str, lr: &str, bugs: &[&str], twins: bool, caught: bool) -> Vec<String> {
    let mut out = Vec::new();
    let mut settings: Vec<&str> = Vec::new();
    for (bug, setting) in BUGS.iter().filter(|(b, _)| bugs.contains(b)) {
        if twins && !settings.contains(setting) {
            settings.push(*setting);
            let extra = args(optimizer, lr, setting, "none");
            let (code, r) = zero_edit("subtle", &extra);
            if code != Some(0) {
                out.push(format!("twin ({extra}): exit {code:?}, {}: {}", reason(&r), r["diagnosis"]["detail"]));
            }
        }
        if !caught {
            continue;
        }
        let extra = args(optimizer, lr, setting, bug);
        let (code, r) = zero_edit("subtle", &extra);
        if code != Some(1) || reason(&r) != cause(bug, optimizer) {
            let caution = r["caution"]["reason"].as_str().unwrap_or("none");
            let detail = &r["diagnosis"]["detail"];
            out.push(format!("{bug} ({extra}): exit {code:?}, {}, caution {caution}: {detail}", reason(&r)));
        }
    }
    out
}

fn every_bug() -> Vec<&'static str> {
    BUGS.iter().map(|(b, _)| *b).collect()
}

#[test]
fn subtle_honest_twins_under_adamw_are_equivalent() {
    let out = wrong("adamw", "1e-3", &every_bug(), true, false);
    assert!(out.is_empty(), "honest loops flagged:\n{}", out.join("\n"));
}

#[test]
fn subtle_honest_twins_under_rmsprop_are_equivalent() {
    let out = wrong("rmsprop", "1e-3", &every_bug(), true, false);
    assert!(out.is_empty(), "honest loops flagged:\n{}", out.join("\n"));
}

#[test]
fn subtle_bugs_under_adamw_are_not_equivalent_with_a_cause() {
    let out = wrong("adamw", "1e-3", &every_bug(), false, true);
    assert!(out.is_empty(), "bugs passed or named wrongly:\n{}", out.join("\n"));
}

#[test]
fn subtle_bugs_under_rmsprop_are_not_equivalent_with_a_cause() {
    let out = wrong("rmsprop", "1e-3", &every_bug(), false, true);
    assert!(out.is_empty(), "bugs passed or named wrongly:\n{}", out.join("\n"));
}

/// AdamW at a fine-tuning rate (2e-5), where each step moves the weights little: the bugs
/// still caught, their twins still EQUIVALENT.
#[test]
fn subtle_bugs_at_a_fine_tuning_rate_are_caught_and_their_twins_pass() {
    let out = wrong("adamw", "2e-5", FINE_TUNING, true, true);
    assert!(out.is_empty(), "cases judged wrong:\n{}", out.join("\n"));
}
