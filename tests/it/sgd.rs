//! The optimizer against `torch.optim.SGD` (golden/sgd, made by fixtures/sgd_cases.py).

use ddp_verify::train::optim::Sgd;
use tch::Tensor;

use crate::util::{json_file, repo};

#[test]
fn sgd_steps_are_bit_identical_to_torch_optim_sgd() {
    let meta = json_file("golden/sgd/cases.json");
    let tensors = Tensor::read_safetensors(repo("golden/sgd/cases.safetensors")).unwrap();
    let get = |name: String| tensors.iter().find(|(n, _)| *n == name).unwrap().1.shallow_clone();
    for c in meta["cases"].as_array().unwrap() {
        let i = c["case"].as_u64().unwrap();
        let param = get(format!("{i}.param")).copy().set_requires_grad(true);
        let mut opt =
            Sgd::new(&[param.shallow_clone()], c["lr"].as_f64().unwrap(), c["momentum"].as_f64().unwrap(), 0.0)
                .unwrap();
        for s in 0..c["steps"].as_u64().unwrap() {
            let mut grad = param.grad();
            if !grad.defined() {
                // First step: give the parameter a gradient tensor to fill.
                (param.sum(None) * 0.0).backward();
                grad = param.grad();
            }
            grad.copy_(&get(format!("{i}.grad.{s}")));
            opt.step().unwrap();
            let want = Vec::<f32>::try_from(&get(format!("{i}.after.{s}"))).unwrap();
            let got = Vec::<f32>::try_from(&param.detach()).unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "case {i} step {s}");
        }
    }
}
