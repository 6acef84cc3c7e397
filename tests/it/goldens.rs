//! The binary on every golden case: W real MPI ranks against one process, and both against
//! PyTorch's own traces of the same runs.

use tch::Tensor;

use crate::util::{ddp_verify, golden_flags, repo, stderr, stdout};

fn check_golden(case: &str) -> String {
    let dir = repo(&format!("golden/{case}"));
    let mut args = golden_flags(case);
    args.extend(["--golden".into(), dir.display().to_string()]);
    let out = ddp_verify(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{case}: {text}{}", stderr(&out));
    assert!(text.contains("\nEQUIVALENT"), "{text}");
    assert!(!text.contains("DIVERGED"), "{text}");
    // The golden comparisons ran, both runs against PyTorch's, over every step.
    for side in ["accumulation vs golden accumulation", "ddp          vs golden ddp"] {
        let line = text.lines().find(|l| l.trim_start().starts_with(side)).unwrap_or_else(|| panic!("{side}: {text}"));
        assert!(line.contains("steps + final weights"), "{line}");
    }
    text
}

macro_rules! golden_case {
    ($($name:ident => $dir:literal),* $(,)?) => {$(
        #[test]
        fn $name() {
            check_golden($dir);
        }
    )*};
}

golden_case! {
    golden_article_is_equivalent_and_matches_pytorch => "article",
    golden_shuffle_over_3_epochs_is_equivalent_and_matches_pytorch => "shuffle-3-epochs",
    golden_three_ranks_are_equivalent_and_match_pytorch => "w3",
    golden_k4_w2_no_sync_accumulation_is_equivalent_and_matches_pytorch => "k4-w2",
    golden_padding_when_n_is_not_divisible_by_w_is_equivalent_and_matches_pytorch => "uneven",
    golden_partial_window_carried_across_epochs_is_equivalent_and_matches_pytorch => "carry-drop-last",
    golden_resnet_tiny_k2_w2_lockstep_matches_torchrun_bit_for_bit => "resnet-tiny-k2-w2",
    golden_resnet_tiny_k4_w2_shuffle_lockstep_matches_torchrun_bit_for_bit => "resnet-tiny-k4-w2-shuffle",
    golden_resnet18_three_steps_from_our_seeded_init_match_torchrun => "resnet18-w2",
    golden_resnet_tiny_float64_free_running_stays_equivalent_and_matches_torchrun => "resnet-tiny-float64",
    golden_resnet_tiny_bfloat16_lockstep_matches_torchrun => "resnet-tiny-bfloat16",
    golden_resnet_tiny_float16_lockstep_matches_torchrun => "resnet-tiny-float16",
}

/// tiny-lm's three runs against PyTorch's (fixtures/lm_reference.py): model, data, seeded
/// init and token-level normalisation rebuilt op for op, so accumulation and the big batch
/// match bit for bit, and DDP too where gloo adds two partials as we do.
#[test]
fn golden_tiny_lm_runs_match_pytorch_including_its_big_batch() {
    for (case, exact) in [("tiny-lm-k2-w2", 3), ("tiny-lm-k4-w2-short-window", 3), ("tiny-lm-w3", 2)] {
        let text = check_golden(case);
        let line = text.lines().find(|l| l.trim_start().starts_with("big batch    vs golden big batch"));
        assert!(line.is_some_and(|l| l.contains("steps + final weights")), "{case}: {text}");
        assert_eq!(text.matches("max 0 ulp: exact").count(), exact, "{case}: {text}");
    }
}

/// The optimizer step against PyTorch's (fixtures/*_reference.py --optimizer, --clip-grad-norm,
/// --lr-schedule): AdamW with decoupled weight decay, clipping that fires at some steps and
/// not others, warmup and cosine schedules, each step's learning rate compared exactly and
/// AdamW's moments compared like weights.
#[test]
fn golden_optimizer_steps_match_pytorch() {
    for (case, moments) in [("adamw-clip-warmup", true), ("sgd-cosine-clip-w3", false), ("tiny-lm-adamw-cosine", true)]
    {
        let text = check_golden(case);
        assert_eq!(text.contains("and AdamW's moments, against the bound"), moments, "{case}: {text}");
        assert!(text.contains("optimizer: "), "{case}: {text}");
    }
}

/// tiny-lm with dropout (masks keyed by seed, epoch, sample and layer, which
/// fixtures/lm_reference.py draws the same way): accumulation and the big batch match
/// PyTorch's bit for bit, so the masks are PyTorch's.
#[test]
fn golden_dropout_masks_match_pytorch() {
    for case in ["tiny-lm-dropout", "tiny-lm-dropout-w3"] {
        let text = check_golden(case);
        for side in ["accumulation vs golden accumulation", "big batch    vs golden big batch"] {
            let line =
                text.lines().find(|l| l.trim_start().starts_with(side)).unwrap_or_else(|| panic!("{side}: {text}"));
            assert!(line.contains("max 0 ulp: exact"), "{case}: {line}");
        }
    }
}

/// Narrow dtypes on the linear model: DDP's rounded all-reduce of two ranks and the
/// accumulation run's sums match gloo's and PyTorch's bit for bit.
#[test]
fn golden_bfloat16_and_float16_linear_runs_match_pytorch_bit_for_bit() {
    for case in ["article-bfloat16", "k4-w2-float16"] {
        let text = check_golden(case);
        assert!(text.contains("accumulation vs golden accumulation") && text.contains("max 0 ulp: exact"), "{text}");
        assert_eq!(text.matches("max 0 ulp: exact").count(), 2, "{case}: {text}");
    }
}

#[test]
fn the_articles_command_prints_pytorchs_final_weights_for_both_runs() {
    let out =
        ddp_verify(&["--acc-steps", "2", "--gpus", "2", "--epochs", "2", "--batch-size", "4", "--data-size", "8"]);
    assert_eq!(out.status.code(), Some(0));
    // PyTorch's final weights for this config, printed the way PyTorch prints them (4 decimals).
    let golden = Tensor::read_safetensors(repo("golden/article/ddp.safetensors")).unwrap();
    let w = &golden.iter().find(|(n, _)| n == "final.linear.weight").unwrap().1;
    let values: Vec<String> =
        Vec::<f32>::try_from(&w.flatten(0, -1)).unwrap().iter().map(|x| format!("{x:.4}")).collect();
    let line = format!("[{}]", values.join(", "));
    let text = stdout(&out);
    assert!(text.contains(&format!("accumulation  {line}")), "{text}");
    assert!(text.contains(&format!("ddp           {line}")), "{text}");
}

#[test]
fn a_zero_tolerance_catches_the_reduction_order_of_three_ranks() {
    // Open MPI and gloo sum three partial gradients in different orders (1 ulp apart): with
    // no tolerance at all the gate must fire and exit 1.
    let mut args = golden_flags("w3");
    let dir = repo("golden/w3").display().to_string();
    args.extend(["--golden", &dir, "--max-ulps", "0", "--rtol", "0", "--atol", "0"].map(String::from));
    let out = ddp_verify(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("NOT EQUIVALENT"), "{text}");
}

/// The wider bounds of bfloat16 and float16 still catch planted bugs, and name them.
#[test]
fn narrow_dtypes_still_catch_planted_bugs() {
    let base = ["--device", "cpu", "--data-size", "15", "--batch-size", "2", "--acc-steps", "4", "--gpus", "2"];
    for (dtype, bug, cause) in [
        ("bfloat16", "no-loss-scale", "loss scaling"),
        ("float16", "double-scale", "loss scaling"),
        ("bfloat16", "stale-zero-grad", "are not zeroed"),
        ("float16", "contiguous-split", "different samples"),
    ] {
        let mut args = base.to_vec();
        args.extend(["--shuffle", "--epochs", "3", "--dtype", dtype, "--inject", bug]);
        let out = ddp_verify(&args);
        let text = stdout(&out);
        assert_eq!(out.status.code(), Some(1), "{dtype} {bug}: {text}{}", stderr(&out));
        assert!(text.contains(cause), "{dtype} {bug}: {text}");
    }
}

/// Mixed precision against PyTorch's own `torch.autocast("cpu")` and `torch.amp.GradScaler`
/// (fixtures/*_reference.py --amp): bfloat16 and float16 forward passes on every model, loss
/// scales and skipped steps compared exactly (k4-w2: skips at steps 0 and 3, the scale
/// growing in between; the overflow case: every rank skips step 1), accumulation bit for bit.
#[test]
fn golden_amp_runs_match_pytorch_autocast_and_grad_scaler() {
    let cases = [
        ("article-amp-bfloat16", 0),
        ("k4-w2-amp-float16", 2),
        ("amp-float16-overflow-w3", 1),
        ("tiny-lm-amp-bfloat16", 0),
        ("tiny-lm-amp-float16-w3", 0),
        ("resnet-tiny-amp-bfloat16", 0),
        ("resnet-tiny-amp-float16", 0),
    ];
    for (case, skipped) in cases {
        let text = check_golden(case);
        let line = text.lines().find(|l| l.trim_start().starts_with("accumulation vs golden accumulation"));
        assert!(line.is_some_and(|l| l.contains("max 0 ulp: exact")), "{case}: {text}");
        assert!(text.contains("amp: forward passes under autocast"), "{case}: {text}");
        assert_eq!(text.matches("skipped by both loss scalers").count(), skipped, "{case}: {text}");
    }
}

/// Goldens made on a GPU (`fixtures/make_golden.sh cuda`, headers with `"device": "cuda"`) are
/// checked on CUDA only. None is committed yet and this machine has no GPU, so the test is
/// ignored, its reason in the output; run where both exist (`cargo test --test integration --
/// --ignored goldens::cuda`), it fails unless there is a CUDA golden to check and a GPU to run it.
#[test]
#[ignore = "needs a GPU and goldens made on CUDA (fixtures/make_golden.sh cuda): run with --ignored where both exist"]
fn cuda_goldens_are_checked_where_cuda_runs() {
    let mut cases: Vec<String> = std::fs::read_dir(repo("golden"))
        .unwrap()
        .filter_map(|e| {
            let dir = e.ok()?.path();
            let meta: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).ok()?).ok()?;
            (meta["device"] == "cuda").then(|| dir.file_name()?.to_str().map(String::from)).flatten()
        })
        .collect();
    cases.sort();
    assert!(!cases.is_empty(), "no golden made on CUDA is committed: fixtures/make_golden.sh cuda makes them");
    let devices = stdout(&ddp_verify(&["devices"]));
    let cuda =
        devices.lines().any(|l| l.starts_with("libtorch:") && l.contains("GPUs visible") && !l.contains(" 0 GPUs"));
    assert!(cuda, "no GPU visible to libtorch here: {devices}");
    for case in &cases {
        check_golden(case);
    }
}
