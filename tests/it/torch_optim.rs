//! The optimizer step against PyTorch: `torch.optim.SGD` (golden/sgd, made by
//! fixtures/sgd_cases.py), `torch.optim.AdamW(foreach=False)` and
//! `torch.nn.utils.clip_grad_norm_` (golden/adamw, made by fixtures/adamw_cases.py).

use ddp_verify::spec::{OptimConfig, Optimizer as Which};
use ddp_verify::train::optim::{clip_grad_norm, Optimizer};
use ddp_verify::TrainConfig;
use serde_json::Value;
use tch::{Kind, Tensor};

fn golden(dir: &str) -> (Value, impl Fn(String) -> Tensor) {
    let dir = crate::util::golden_dir(dir);
    let meta: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("cases.json")).unwrap()).unwrap();
    let tensors = Tensor::read_safetensors(dir.join("cases.safetensors")).unwrap();
    let get = move |name: String| tensors.iter().find(|(n, _)| *n == name).unwrap().1.shallow_clone();
    (meta, get)
}

fn bits(t: &Tensor) -> Vec<u64> {
    Vec::<f64>::try_from(&t.detach().to_kind(Kind::Double).flatten(0, -1))
        .unwrap()
        .iter()
        .map(|x| x.to_bits())
        .collect()
}

/// Steps `param` with each recorded gradient, checking what `check(step)` asks after each.
fn run(cfg: &TrainConfig, param: &Tensor, grads: impl Fn(u64) -> Tensor, steps: u64, check: impl Fn(u64, &Optimizer)) {
    let mut opt = Optimizer::new(cfg, &[("p".to_string(), param.shallow_clone())]).unwrap();
    for s in 0..steps {
        let mut grad = param.grad();
        if !grad.defined() {
            // First step: give the parameter a gradient tensor to fill.
            (param.sum(None) * 0.0).backward();
            grad = param.grad();
        }
        grad.copy_(&grads(s));
        opt.step().unwrap();
        check(s, &opt);
    }
}

#[test]
fn sgd_steps_are_bit_identical_to_torch_optim_sgd() {
    let (meta, get) = golden("sgd");
    for c in meta["cases"].as_array().unwrap() {
        let i = c["case"].as_u64().unwrap();
        let optim = OptimConfig {
            lr: c["lr"].as_f64().unwrap(),
            momentum: c["momentum"].as_f64().unwrap(),
            ..Default::default()
        };
        let cfg = TrainConfig { optim, ..TrainConfig::article() };
        let param = get(format!("{i}.param")).copy().set_requires_grad(true);
        run(
            &cfg,
            &param,
            |s| get(format!("{i}.grad.{s}")),
            c["steps"].as_u64().unwrap(),
            |s, _| {
                assert_eq!(bits(&param), bits(&get(format!("{i}.after.{s}"))), "case {i} step {s}");
            },
        );
    }
}

#[test]
fn adamw_steps_and_moments_are_bit_identical_to_torch_optim_adamw() {
    let (meta, get) = golden("adamw");
    for c in meta["cases"].as_array().unwrap() {
        let i = c["case"].as_u64().unwrap();
        let betas = (c["betas"][0].as_f64().unwrap(), c["betas"][1].as_f64().unwrap());
        let optim = OptimConfig {
            lr: c["lr"].as_f64().unwrap(),
            weight_decay: c["weight_decay"].as_f64().unwrap(),
            optimizer: Which::AdamW,
            betas,
            eps: c["eps"].as_f64().unwrap(),
            ..Default::default()
        };
        let cfg = TrainConfig { optim, ..TrainConfig::article() };
        let param = get(format!("{i}.param")).copy().set_requires_grad(true);
        run(
            &cfg,
            &param,
            |s| get(format!("{i}.grad.{s}")),
            c["steps"].as_u64().unwrap(),
            |s, opt| {
                assert_eq!(bits(&param), bits(&get(format!("{i}.after.{s}"))), "case {i} step {s}");
                let state = opt.state();
                for (key, t) in [("exp_avg", &state[0].1), ("exp_avg_sq", &state[1].1)] {
                    assert_eq!(bits(t), bits(&get(format!("{i}.{key}.{s}"))), "case {i} step {s} {key}");
                }
            },
        );
    }
}

#[test]
fn clipping_is_bit_identical_to_clip_grad_norm() {
    let (meta, get) = golden("adamw");
    for c in meta["clip"].as_array().unwrap() {
        let j = c["case"].as_str().unwrap();
        let sizes = c["sizes"].as_array().unwrap().len();
        let grads: Vec<Tensor> = (0..sizes).map(|k| get(format!("{j}.grad.{k}")).copy()).collect();
        let coef = clip_grad_norm(&grads, c["max_norm"].as_f64().unwrap()).unwrap();
        assert_eq!(coef < 1.0, c["clipped"].as_bool().unwrap(), "{j}");
        for (k, g) in grads.iter().enumerate() {
            assert_eq!(bits(g), bits(&get(format!("{j}.clipped.{k}"))), "{j} tensor {k}");
        }
    }
}
