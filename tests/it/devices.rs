//! --device and `ddp-verify devices` on this machine. CI has no GPU, so this checks every
//! path that needs none: the NCCL library cudarc opens, libtorch's CUDA half, the refusals.

use crate::util::{ddp_verify, repo, stderr, stdout};

fn devices() -> String {
    let o = ddp_verify(&["devices"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    stdout(&o)
}

fn has_driver() -> bool {
    !devices().contains("driver:   not found")
}

/// cudarc opens the same NCCL that PyTorch's wheel loads, and reads its version.
#[test]
fn nccl_is_the_wheels() {
    let py = std::process::Command::new(repo(".venv/bin/python"))
        .args(["-c", "import torch; print('%d.%d.%d' % torch.cuda.nccl.version())"])
        .output()
        .expect("the .venv from scripts/setup.sh");
    let torch_says = String::from_utf8_lossy(&py.stdout).trim().to_string();
    assert!(!torch_says.is_empty(), "{}", String::from_utf8_lossy(&py.stderr));
    assert!(devices().contains(&format!("nccl:     {torch_says}\n")), "{}", devices());
}

/// libtorch_cuda.so is opened at run time (the linker drops it): once loaded, libtorch
/// explains a missing GPU in its own words instead of "without ATen_cuda library".
#[test]
fn libtorch_cuda_half_loads() {
    let out = devices();
    let line = out.lines().find(|l| l.starts_with("libtorch:")).unwrap();
    assert!(line.contains("libtorch_cuda.so loaded"), "{out}");
    assert!(!line.contains("ATen_cuda"), "{out}");
    if !has_driver() {
        assert!(line.contains("no GPU: Found no NVIDIA driver"), "{out}");
    }
}

#[test]
fn cuda_without_a_gpu_is_one_line_and_exit_2() {
    if has_driver() {
        // A GPU machine: nothing to refuse, but `devices` must then see the driver.
        let o = ddp_verify(&["devices"]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        assert!(!stdout(&o).contains("no NVIDIA driver"), "{}", stdout(&o));
        return;
    }
    for extra in [&[][..], &["--model", "resnet-tiny", "--batch-size", "2", "--data-size", "8"][..]] {
        let mut args = vec!["--device", "cuda"];
        args.extend_from_slice(extra);
        let o = ddp_verify(&args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(err.starts_with("ddp-verify: --device: cuda was asked for but no NVIDIA driver"), "{err}");
        assert!(err.contains("--device cpu"), "{err}");
        assert!(stdout(&o).is_empty());
    }
}

/// Without --device the report says where the runs computed and why.
#[test]
fn auto_says_which_device() {
    let o = ddp_verify(&["--acc-steps", "2", "--gpus", "2"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    let line = out.lines().find(|l| l.starts_with("device: ")).expect("a device line");
    if has_driver() {
        assert!(line.starts_with("device: cuda (auto: "), "{out}");
    } else {
        assert_eq!(line, "device: cpu (auto: no NVIDIA driver (libcuda.so.1 not found)), portable kernels");
    }
    let o = ddp_verify(&["--acc-steps", "2", "--gpus", "2", "--device", "cpu", "--report", "json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let json: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!((&json["device"], &json["device_note"]), (&"cpu".into(), &"cpu (--device cpu)".into()), "{json}");
}
