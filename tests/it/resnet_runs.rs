//! ResNets through the binary: BatchNorm's refusals, buffers, lockstep against free-running,
//! and determinism. (The golden cases against torchrun are in golden_cases.rs.)

use crate::util::{ddp_verify, repo, stderr, stdout};

/// resnet-tiny, K=4 over W=2 with shuffle: the config the ResNet goldens use, without a golden.
fn tiny(extra: &[&str]) -> Vec<String> {
    let init = repo("golden/resnet/tiny/state.safetensors").display().to_string();
    let mut args: Vec<String> = [
        "--model",
        "resnet-tiny",
        "--init",
        &init,
        "--data-size",
        "32",
        "--batch-size",
        "2",
        "--acc-steps",
        "4",
        "--gpus",
        "2",
        "--epochs",
        "2",
        "--shuffle",
        "--seed",
        "5",
    ]
    .map(String::from)
    .to_vec();
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

fn run(args: &[String]) -> (Option<i32>, String, String) {
    let out = ddp_verify(&args.iter().map(String::as_str).collect::<Vec<_>>());
    (out.status.code(), stdout(&out), stderr(&out))
}

#[test]
fn a_micro_batch_of_one_through_batchnorm_is_refused_before_anything_runs() {
    // 6 samples over 2 ranks in batches of 2: each shard of 3 ends in a batch of 1, and at
    // 32x32 the last stage is 1x1, so BatchNorm would see one value per channel.
    let args = ["--model", "resnet-tiny", "--data-size", "6", "--batch-size", "2", "--acc-steps", "2", "--gpus", "2"];
    let (code, out, err) = run(&args.map(String::from));
    assert_eq!(code, Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("--batch-size") && err.contains("micro-batch of 1") && err.contains("one value per channel"));
    assert!(out.is_empty());
    // A larger image keeps two values per channel: accepted.
    let (code, _, err) = run(&args
        .iter()
        .map(|s| s.to_string())
        .chain(["--image-size", "64", "--max-steps", "1"].map(String::from))
        .collect::<Vec<_>>());
    assert_eq!(code, Some(0), "{err}");
}

#[test]
fn resnet_refusals_name_the_flag() {
    for (extra, names) in [
        (vec!["--init", "/no/such/state.safetensors"], "/no/such/state.safetensors"),
        (vec!["--max-steps", "0"], "--max-steps"),
        (vec!["--classes", "1"], "--classes"),
        (vec!["--sync-bn"], "--sync-bn: SyncBatchNorm is never equivalent to accumulation"),
        (vec!["--weight-decay=-1"], "--weight-decay"),
    ] {
        let mut args = tiny(&extra);
        if extra[0] == "--init" {
            args.drain(2..4); // the default --init
        }
        let (code, out, err) = run(&args);
        assert_eq!(code, Some(2), "{extra:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{extra:?}: {err}");
        assert!(err.contains(names), "{extra:?}: {err}");
        assert!(out.is_empty());
    }
    let (code, _, err) = run(&["--model", "resnet9"].map(String::from));
    assert_eq!(code, Some(2));
    assert!(err.contains("unknown model 'resnet9'"), "{err}");
}

#[test]
fn lockstep_is_equivalent_where_free_running_float32_drifts_apart() {
    // The chaos the issue measured: equivalent runs, but float32 rounding differences grow
    // step by step through BatchNorm, so free-running runs part within a few steps.
    let (code, text, err) = run(&tiny(&["--free-running"]));
    assert_eq!(code, Some(1), "{text}{err}");
    assert!(text.contains("mode: free-running") && text.contains("--lockstep"), "{text}");
    assert!(text.contains("step 0 agrees to rounding") && text.contains("amplifies rounding"), "{text}");
    let (code, text, err) = run(&tiny(&[]));
    assert_eq!(code, Some(0), "{text}{err}");
    assert!(text.contains("mode: lockstep") && text.contains("\nEQUIVALENT"), "{text}");
    // Worst tensors are named; buffers differ, as DDP's broadcast makes them, but do not count.
    assert!(text.contains("worst tensors") && text.contains("differs (expected)"), "{text}");
    assert!(text.contains("num_batches_tracked: accumulation 32, DDP rank 0"), "{text}");
    // Unless the user asks for them to count.
    let (code, text, _) = run(&tiny(&["--strict-buffers"]));
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("counted (--strict-buffers)"), "{text}");
}

#[test]
fn two_identical_resnet_runs_write_bit_identical_traces() {
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for i in 0..2 {
        let out = dir.path().join(i.to_string());
        let (code, _, err) = run(&tiny(&["--max-steps", "2", "--save-trace", out.to_str().unwrap()]));
        assert_eq!(code, Some(0), "{err}");
        files.push(["accumulation.safetensors", "ddp.safetensors"].map(|f| std::fs::read(out.join(f)).unwrap()));
    }
    assert!(files[0][0].len() > 100_000, "the trace holds every step's gradients");
    assert!(files[0] == files[1], "identical ResNet runs gave different traces");
}

#[test]
fn planted_bugs_are_caught_on_a_resnet_in_lockstep_with_the_right_cause() {
    let flags = ["--model", "resnet-tiny", "--data-size", "16", "--max-steps", "3"];
    for (bug, cause) in [("no-loss-scale", "0.50x accumulation's"), ("stale-zero-grad", "not zeroed")] {
        let args: Vec<String> = flags.iter().chain(&["--inject", bug]).map(|s| s.to_string()).collect();
        let (code, text, err) = run(&args);
        assert_eq!(code, Some(1), "{bug}: {text}{err}");
        assert!(text.contains("NOT EQUIVALENT") && text.contains(cause), "{bug}: {text}");
    }
}
