//! The Rust ResNets against torchvision itself (golden/resnet, made by
//! fixtures/resnet_check.py): state_dict names and shapes, and one train-mode
//! forward/backward of resnet-tiny from torchvision's own initial state.

use ddp_verify::evidence::Trace;
use ddp_verify::judge::{compare, Verdict};
use ddp_verify::train::models::{Model, ResNet, ResNetSpec};
use ddp_verify::Tolerance;
use tch::{Kind, Tensor};

use crate::util::{json_file, repo};

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
        steps: vec![floats(model.parameters().iter().map(|(n, p)| (n.clone(), p.grad())))],
        finals: floats(
            model
                .buffers()
                .iter()
                .map(|(n, b)| (n.clone(), b.shallow_clone()))
                .chain([("loss".into(), loss.detach().reshape([1]))]),
        ),
        ..Default::default()
    };
    let torch = Trace {
        steps: vec![strip(&expected, "grad.")],
        finals: floats(strip(&expected, "buffer.").into_iter().chain([("loss".into(), get(&expected, "loss"))])),
        ..Default::default()
    };
    let c = compare("ours", &ours, "torchvision", &torch, &Tolerance::default());
    let worst = c.steps[0].max_ulps.max(c.finals.max_ulps);
    assert_eq!(c.steps[0].tensors.len(), model.parameters().len());
    assert_ne!(c.verdict, Verdict::Diverged, "worst {worst} ulp");
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
