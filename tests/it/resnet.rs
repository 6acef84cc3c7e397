//! The Rust ResNets against torchvision itself (golden/resnet, made by
//! fixtures/resnet_check.py): state_dict names and shapes, and one train-mode
//! forward/backward of resnet-tiny from torchvision's own initial state.

use ddp_verify::evidence::Trace;
use ddp_verify::judge::{compare, Agreement};
use ddp_verify::train::models::{Model, ResNet, ResNetSpec};
use ddp_verify::Tolerance;
use tch::{Kind, Tensor};

use crate::util::{ddp_verify, json_file, repo, stderr, stdout};

fn entries(model: &ResNet) -> Vec<(String, Vec<i64>, &'static str, &'static str)> {
    let dtype = |t: &Tensor| if t.kind() == Kind::Int64 { "int64" } else { "float32" };
    let mut v: Vec<_> = model
        .parameters()
        .iter()
        .map(|(n, t)| (n.clone(), t.size(), dtype(t), "parameter"))
        .chain(model.buffers().iter().map(|(n, t)| (n.clone(), t.size(), dtype(t), "buffer")))
        .collect();
    v.sort();
    v
}

#[test]
fn state_dict_names_shapes_and_dtypes_match_torchvision() {
    for (file, spec) in [("resnet18", ResNetSpec::resnet18(10)), ("resnet-tiny", ResNetSpec::tiny(10))] {
        let want: Vec<(String, Vec<i64>, String, String)> = json_file(&format!("golden/resnet/{file}.names.json"))
            ["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                let shape = e["shape"].as_array().unwrap().iter().map(|d| d.as_i64().unwrap()).collect();
                (
                    e["name"].as_str().unwrap().into(),
                    shape,
                    e["dtype"].as_str().unwrap().into(),
                    e["kind"].as_str().unwrap().into(),
                )
            })
            .collect();
        let got: Vec<_> = entries(&ResNet::new(spec, 0))
            .into_iter()
            .map(|(n, s, d, k)| (n, s, d.to_string(), k.to_string()))
            .collect();
        assert_eq!(got, want, "{file}");
    }
}

/// Float tensors only (num_batches_tracked is checked apart), sorted by name.
fn floats(v: impl IntoIterator<Item = (String, Tensor)>) -> Vec<(String, Tensor)> {
    let mut v: Vec<(String, Tensor)> = v.into_iter().filter(|(_, t)| t.kind() == Kind::Float).collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// As the evidence holds them.
fn host(v: Vec<(String, Tensor)>) -> ddp_verify::evidence::Params {
    v.iter().map(|(n, t)| (n.clone(), ddp_verify::train::host::host(t))).collect()
}

/// The tensors of `set` named `<prefix><name>`, as `<name>`.
fn strip(set: &[(String, Tensor)], prefix: &str) -> Vec<(String, Tensor)> {
    floats(set.iter().filter_map(|(n, t)| Some((n.strip_prefix(prefix)?.to_string(), t.shallow_clone()))))
}

#[test]
fn resnet_tiny_forward_and_backward_match_torchvision() {
    // One intra-op thread, as every training process and fixtures/make_golden.sh use: the
    // thread count decides how some kernels split their sums.
    ddp_verify::dist::world::pin_threads();
    let model = ResNet::new(ResNetSpec::tiny(10), 0);
    model.load_state(&repo("golden/resnet/tiny/state.safetensors")).unwrap();
    let batch = Tensor::read_safetensors(repo("golden/resnet/tiny/batch.safetensors")).unwrap();
    let expected = Tensor::read_safetensors(repo("golden/resnet/tiny/expected.safetensors")).unwrap();
    let get = |set: &[(String, Tensor)], n: &str| set.iter().find(|(k, _)| k == n).unwrap().1.shallow_clone();
    let loss = model.loss_of(&get(&batch, "x"), &get(&batch, "y"));
    loss.backward();

    // The gradients as one step; the BatchNorm running statistics and the loss as finals.
    let ours = Trace {
        steps: vec![host(floats(model.parameters().iter().map(|(n, p)| (n.clone(), p.grad()))))],
        finals: host(floats(
            model
                .buffers()
                .iter()
                .map(|(n, b)| (n.clone(), b.shallow_clone()))
                .chain([("loss".into(), loss.detach().reshape([1]))]),
        )),
        ..Default::default()
    };
    let torch = Trace {
        steps: vec![host(strip(&expected, "grad."))],
        finals: host(floats(strip(&expected, "buffer.").into_iter().chain([("loss".into(), get(&expected, "loss"))]))),
        ..Default::default()
    };
    let c = compare("ours", &ours, "torchvision", &torch, &Tolerance::default());
    let worst = c.steps[0].max_ulps.max(c.finals.max_ulps);
    assert_eq!(c.steps[0].tensors.len(), model.parameters().len());
    assert_ne!(c.verdict, Agreement::Diverged, "worst {worst} ulp");
    eprintln!("resnet-tiny vs torchvision: {} (worst {worst} ulp)", c.verdict.label());
    // Every BatchNorm counted the one batch, as the module does.
    for (n, b) in model.buffers().iter().filter(|(n, _)| n.ends_with("num_batches_tracked")) {
        assert_eq!(i64::try_from(b).unwrap(), i64::try_from(&get(&expected, &format!("buffer.{n}"))).unwrap(), "{n}");
    }
}

#[test]
fn a_state_file_with_a_missing_or_misshapen_tensor_is_refused() {
    let model = ResNet::new(ResNetSpec::tiny(10), 0);
    let state = Tensor::read_safetensors(repo("golden/resnet/tiny/state.safetensors")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.safetensors");
    let without_fc: Vec<_> = state.iter().filter(|(n, _)| n != "fc.bias").map(|(n, t)| (n.clone(), t.copy())).collect();
    Tensor::write_safetensors(&without_fc, &path).unwrap();
    let e = model.load_state(&path).unwrap_err();
    assert!(e.to_string().contains("has no tensor fc.bias") && e.exit().code() == 2, "{e}");
    let misshapen: Vec<_> = state
        .iter()
        .map(|(n, t)| (n.clone(), if n == "fc.bias" { Tensor::zeros([3], tch::kind::FLOAT_CPU) } else { t.copy() }))
        .collect();
    Tensor::write_safetensors(&misshapen, &path).unwrap();
    let e = model.load_state(&path).unwrap_err();
    assert!(e.to_string().contains("fc.bias is Float [3], the model needs Float [10]"), "{e}");
}

// ResNets through the binary: BatchNorm's refusals, buffers, lockstep against free-running,
// and determinism (the golden cases against torchrun are in goldens.rs).

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
