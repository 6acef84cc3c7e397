//! Plain data every stage receives: what to train, how closely to compare, which bug to
//! plant, where to compute and what to report. Nothing here computes or validates; the
//! values come from `lower.rs`, which checks them all once.

mod amp;
mod bug;
mod config;
mod device;
mod dtype;
mod kernels;
mod launcher;
mod optim;
mod options;
mod report;
mod tolerance;
mod train;

pub use amp::{Amp, AmpConfig, OVERFLOW_FACTOR};
pub use bug::{Bug, Side};
pub use config::Config;
pub use device::{DeviceKind, DeviceRequest};
pub use dtype::Dtype;
pub use kernels::{KernelFacts, KernelMode, Machine, Platform};
pub use launcher::{Launcher, LauncherKind};
pub use optim::{OptimConfig, Optimizer, Schedule};
pub use options::{CompareOptions, ExploreOptions, ScriptOptions, Suite, SuiteCase};
pub use report::{Format, ReportTarget};
pub use tolerance::{Tolerance, ToleranceOverrides};
pub use train::{ModelKind, PartialWindow, TrainConfig};

#[cfg(test)]
mod tests {
    use super::*;
    use ddp_verify_cli::names;

    /// Each enum's names are written beside its variants (a `match`), and the flags accept
    /// `names::*`: both lists agree, in order, and every name parses back to its variant, so
    /// reordering either cannot swap two names silently.
    #[test]
    fn every_name_belongs_to_its_variant() {
        fn check<T: Copy + PartialEq + std::fmt::Debug>(
            all: &[T],
            name: fn(T) -> &'static str,
            parse: fn(&str) -> Option<T>,
            flag: &[&str],
        ) {
            let ours: Vec<&str> = all.iter().map(|&v| name(v)).collect();
            assert_eq!(ours, flag);
            for &v in all {
                assert_eq!(parse(name(v)), Some(v), "{v:?}");
            }
        }
        check(&Bug::ALL, Bug::name, Bug::parse, &names::BUGS);
        check(&ModelKind::ALL, ModelKind::name, ModelKind::parse, &names::MODELS);
        check(&Dtype::ALL, Dtype::name, Dtype::parse, &names::DTYPES);
        check(&PartialWindow::ALL, PartialWindow::name, PartialWindow::parse, &names::PARTIAL_WINDOWS);
        check(&Optimizer::ALL, Optimizer::name, Optimizer::parse, &names::OPTIMIZERS);
        check(&Amp::ALL, Amp::name, Amp::parse, &names::AMPS);
        check(&KernelMode::ALL, KernelMode::name, KernelMode::parse, &names::KERNELS);
    }
}
