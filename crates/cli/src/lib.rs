//! ddp-verify's command line, defined once for both binaries: the launcher (`ddp-verify`,
//! no libtorch) reads `--gpus` and `--timeout` from it to start the ranks, and every rank
//! (`ddp-verify-core`) parses the same flags before lowering them to a validated config.
//! Values that name things (models, dtypes, bugs...) are the enums of [`values`], each
//! name written once; the library uses the same enums.

mod args;
mod case;
pub mod defaults;
mod exit;
pub mod values;

pub use args::{
    AmpArgs, Cli, Command, CompareArgs, ExploreArgs, KernelArgs, NetArgs, OptimArgs, ReportArgs, RunArgs, SplitArgs,
    SplitShape, SuiteArgs, ToleranceArgs, Verification, WatchArgs,
};
pub use case::{case_keys, parse_case, CaseError, CaseValue};
/// `Cli::try_parse()` needs the trait in scope; the core takes it from here.
pub use clap::Parser;
pub use exit::{usage_line, Exit, EXIT_CODES};
