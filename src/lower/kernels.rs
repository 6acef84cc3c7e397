//! `--kernels`: the CPU kernels a command computes with, asked for or read from a golden's
//! header (its vendor is this machine's, which needs libtorch to tell).

use std::path::Path;

use ddp_verify_cli::KernelArgs;

use crate::error::{Error, Result};
use crate::evidence::golden;
use crate::spec::KernelMode;

/// `--kernels`, else the mode `golden`'s header records (read before libtorch makes any
/// tensor, which fixes the kernels for the process), else portable. A golden that cannot
/// be read here is refused later, by the run that loads it.
pub fn kernel_mode(args: &KernelArgs, golden: Option<&Path>) -> Result<KernelMode> {
    let asked = args.kernels;
    let vendor = || crate::dist::kernels::machine(crate::spec::DeviceKind::Cpu).vendor;
    let made = golden.and_then(|dir| golden::read_meta(&golden::for_vendor(dir, &vendor()).ok()?).ok());
    let made = made.and_then(|m| m.kernels).map(|k| k.mode);
    match (asked, made) {
        (Some(a), Some(m)) if a != m => Err(Error::bad_flag(
            "--kernels",
            format!("the golden was made with {} kernels, this run asks for {}", m.name(), a.name()),
            format!(
                "drop --kernels to compute as the golden was made, or remake the golden with --kernels {} --bless",
                a.name()
            ),
        )),
        (a, m) => Ok(a.or(m).unwrap_or_default()),
    }
}
