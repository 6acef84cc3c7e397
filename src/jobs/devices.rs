//! `ddp-verify devices`: a self-test of this machine's devices and kernels, with libtorch.

use crate::error::{Exit, Result};
use crate::spec::{Amp, AmpConfig, DeviceKind, Dtype, KernelMode, ModelKind, Precision, Shape, TrainConfig};

/// `ddp-verify devices`: what `--device` can use here for `gpus` local ranks, which CPU
/// kernels compute, and whether they repeat themselves for every model and dtype (exit 4
/// where one does not): a self-test for a new runner, in seconds.
pub fn devices(gpus: usize, mode: KernelMode) -> Result<Exit> {
    let platform = crate::dist::kernels::apply(mode, DeviceKind::Cpu)?;
    print!("{}", crate::dist::device::describe(gpus));
    println!("cpu:      {} ({})", platform.machine.cpu, platform.machine.vendor);
    println!("kernels:  --kernels {}: {}", mode.name(), platform.describe());
    let cap = std::env::var("ONEDNN_MAX_CPU_ISA").ok();
    let isa = crate::dist::kernels::onednn_isa(&crate::dist::kernels::cpu_flags(), cap.as_deref());
    println!("oneDNN:   {} here, used by --kernels native (off in portable)", isa);
    let mut places = vec![DeviceKind::Cpu];
    if crate::dist::device::cuda_gpus().is_ok() {
        places.push(DeviceKind::Cuda);
    }
    let (mut failed, mut checks) = (0, 0);
    println!("repeat check (the first micro-batch twice, bit for bit):");
    for device in places {
        for cfg in self_test_configs(device) {
            let started = std::time::Instant::now();
            checks += 1;
            let what = match cfg.precision.amp.amp {
                Some(amp) => format!("--amp {}", amp.name()),
                None => cfg.precision.dtype.name().to_string(),
            };
            let result = match crate::train::repeat_check(&cfg, platform)? {
                None => "repeats".to_string(),
                Some(why) => {
                    failed += 1;
                    format!("DIFFERS: {} jumped by {:.3e}", why.tensor, why.jump)
                }
            };
            let ms = started.elapsed().as_secs_f64() * 1e3;
            println!("  {:<4}  {:<11}  {what:<16}  {result} ({ms:.0} ms)", device.name(), cfg.model.kind.name());
        }
    }
    if failed > 0 {
        println!(
            "{failed} of {checks} checks differ: runs in those dtypes get no verdict (exit 4) with --kernels {}",
            mode.name()
        );
        return Ok(Exit::NoVerdict);
    }
    Ok(Exit::Equivalent)
}

/// One small config per model, dtype and autocast dtype, on `device`.
fn self_test_configs(device: DeviceKind) -> Vec<TrainConfig> {
    use ddp_verify_cli::defaults as d;
    let models = [ModelKind::Linear, ModelKind::ResnetTiny, ModelKind::TinyLm];
    let dtypes = [Dtype::Float32, Dtype::Float64, Dtype::Bfloat16, Dtype::Float16];
    let small = |model| {
        let mut t = TrainConfig::article();
        t.shape = Shape { data_size: 4, batch_size: 2, acc_steps: 2, gpus: 1, ..t.shape };
        (t.model.kind, t.model.linear.features, t.model.resnet.image_size) = (model, 4, 8);
        (t.run.epochs, t.run.device) = (1, device);
        t
    };
    let amp = |a| AmpConfig {
        amp: Some(a),
        init_scale: d::INIT_SCALE,
        growth_interval: d::GROWTH_INTERVAL,
        overflow_step: None,
    };
    models
        .iter()
        .flat_map(|&m| {
            let with = move |precision: Precision| TrainConfig { precision, ..small(m) };
            let plain = dtypes.iter().map(move |&dtype| with(Precision { dtype, ..Precision::default() }));
            let cast = [Amp::Bfloat16, Amp::Float16]
                .into_iter()
                .map(move |a| with(Precision { amp: amp(a), ..Precision::default() }));
            plain.chain(cast)
        })
        .collect()
}
