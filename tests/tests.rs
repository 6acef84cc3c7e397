//! Integration tests, one binary. Expected values come from real PyTorch (golden/, made by
//! fixtures/make_golden.sh) or from properties.

#[path = "it/util.rs"]
mod util;

/// Every test in this process computes with the portable kernels, as the goldens were made:
/// pinned when the binary loads, before any test thread makes a tensor (libtorch fixes its
/// kernels at the first). The `ddp-verify` processes the tests start pin their own.
#[ctor::ctor]
fn portable_kernels() {
    let mode = ddp_verify::spec::KernelMode::Portable;
    if let Err(e) = ddp_verify::dist::kernels::apply(mode, ddp_verify::spec::DeviceKind::Cpu) {
        eprintln!("tests: cannot pin the portable kernels: {e}");
        std::process::exit(2);
    }
}

#[path = "it/amp.rs"]
mod amp;
#[path = "it/architecture.rs"]
mod architecture;
#[path = "it/ci_examples.rs"]
mod ci_examples;
#[path = "it/cli.rs"]
mod cli;
#[path = "it/compare.rs"]
mod compare;
#[path = "it/devices.rs"]
mod devices;
#[path = "it/explore.rs"]
mod explore;
#[path = "it/faults.rs"]
mod faults;
#[path = "it/golden_cases.rs"]
mod golden_cases;
#[path = "it/hosts.rs"]
mod hosts;
#[path = "it/kernels.rs"]
mod kernels;
#[path = "it/no_harm.rs"]
mod no_harm;
#[path = "it/optimizer_step.rs"]
mod optimizer_step;
#[path = "it/own_loop.rs"]
mod own_loop;
#[path = "it/properties.rs"]
mod properties;
#[path = "it/readers.rs"]
mod readers;
#[path = "it/reports.rs"]
mod reports;
#[path = "it/resnet.rs"]
mod resnet;
#[path = "it/resnet_runs.rs"]
mod resnet_runs;
#[path = "it/sampler.rs"]
mod sampler;
#[path = "it/sgd.rs"]
mod sgd;
#[path = "it/suite.rs"]
mod suite;
#[path = "it/tiny_lm.rs"]
mod tiny_lm;
#[path = "it/trust.rs"]
mod trust;
