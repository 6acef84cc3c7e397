//! Integration tests, one binary, one file per capability. Expected values come from real
//! PyTorch (golden/, made by fixtures/make_golden.sh) or from properties.
//!
//! | file | what it holds |
//! |---|---|
//! | amp | mixed precision: autocast and the float16 loss scaler |
//! | architecture | the one-way flow of stages, and of files inside each |
//! | bad_input | bad input and outputs: refused in one line before anything runs, nothing of others touched |
//! | bounds | how much difference is allowed: margins of honest runs and planted bugs |
//! | ci_examples | the CI configurations in examples/ci |
//! | cli | flags, exit codes, files written, launch modes, printed commands that round-trip |
//! | compare | two recorded traces judged like a run |
//! | culprits | the cause's stage, owner and direction on a script unlike the examples (plain DataLoader) |
//! | deepspeed | DeepSpeed ZeRO 1, 2, 3 scripts unmodified, and Trainer with a DeepSpeed config |
//! | devices | --device and `ddp-verify devices` |
//! | explore | random configurations, shrunk failures, planted bugs |
//! | explore_script | a user's script explored: found, shrunk, named, replayed; no false alarm |
//! | faults | ranks that fail, hang or are signalled |
//! | goldens | every golden case against PyTorch's own traces |
//! | hosts | several hosts in network namespaces |
//! | kernels | portable kernels, where a golden holds, no verdict from kernels that do not repeat |
//! | optimizer_step | AdamW, clipping and schedules through the binary |
//! | optimizers | every optimizer recorded at its own step (a second one, reduced by hand) |
//! | own_loop | the recorder on users' own PyTorch loops |
//! | precision | low precision on an independent loop: measured rounding, small bugs at their stages, watch |
//! | public_scripts | what public scripts hit: shared working folders, hangs at exit, dropout, hard-coded CUDA |
//! | readers | trace and golden readers on corrupted bytes |
//! | reports | every report format |
//! | resnet | the ResNets against torchvision, and through the binary |
//! | sampler | the DistributedSampler port and properties of the split |
//! | shipped | bugs that shipped in real libraries: verdict, stage and owner on both versions |
//! | subtle | small real bugs in a plain DDP loop (weight decay, schedules, EMA, clipping, ...) beside honest twins |
//! | suite | named cases for a CI gate |
//! | sweep | the sweep of current releases' cheapest configurations, as it found them (bench/sweep) |
//! | tiny_lm | the language model, token-level loss and the big batch |
//! | torch_optim | the optimizer step op for op against torch.optim and clip_grad_norm_ |
//! | user_loops | users' own scripts unmodified (-- python train.py): nanoGPT, Trainer, Lightning, Accelerate |

#[path = "it/util.rs"]
mod util;

/// The tests run side by side in the repository's folder: the `ddp-verify` processes they
/// start share it unwatched, or each check would move the others' files aside
/// (`tests/it/public_scripts.rs` watches its own folders). Set before any thread starts.
#[ctor::ctor]
fn shared_folder() {
    std::env::set_var(ddp_verify::jobs::workdir::SHARE_FOLDER_ENV, "1");
}

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
#[path = "it/bad_input.rs"]
mod bad_input;
#[path = "it/bounds.rs"]
mod bounds;
#[path = "it/ci_examples.rs"]
mod ci_examples;
#[path = "it/cli.rs"]
mod cli;
#[path = "it/compare.rs"]
mod compare;
#[path = "it/culprits.rs"]
mod culprits;
#[path = "it/deepspeed.rs"]
mod deepspeed;
#[path = "it/devices.rs"]
mod devices;
#[path = "it/explore.rs"]
mod explore;
#[path = "it/explore_script.rs"]
mod explore_script;
#[path = "it/faults.rs"]
mod faults;
#[path = "it/goldens.rs"]
mod goldens;
#[path = "it/hosts.rs"]
mod hosts;
#[path = "it/kernels.rs"]
mod kernels;
#[path = "it/optimizer_step.rs"]
mod optimizer_step;
#[path = "it/optimizers.rs"]
mod optimizers;
#[path = "it/own_loop.rs"]
mod own_loop;
#[path = "it/precision.rs"]
mod precision;
#[path = "it/public_scripts.rs"]
mod public_scripts;
#[path = "it/readers.rs"]
mod readers;
#[path = "it/reports.rs"]
mod reports;
#[path = "it/resnet.rs"]
mod resnet;
#[path = "it/sampler.rs"]
mod sampler;
#[path = "it/sharded.rs"]
mod sharded;
#[path = "it/shipped.rs"]
mod shipped;
#[path = "it/subtle.rs"]
mod subtle;
#[path = "it/suite.rs"]
mod suite;
#[path = "it/sweep.rs"]
mod sweep;
#[path = "it/tiny_lm.rs"]
mod tiny_lm;
#[path = "it/torch_optim.rs"]
mod torch_optim;
#[path = "it/user_loops.rs"]
mod user_loops;
#[path = "it/watch.rs"]
mod watch;
