//! `compare`'s flags: two recorded traces, judged as a run's legs are.

use ddp_verify_cli::CompareArgs;

use super::{checked_overrides, reports};
use crate::error::{Error, Result};
use crate::evidence::SAVED_FILES;
use crate::spec::CompareOptions;

/// `compare`'s flags: the two trace files (a directory stands for the pair `--save-trace`
/// writes), the tolerance and the reports, checked before either file is read.
pub fn compare(args: &CompareArgs) -> Result<CompareOptions> {
    let paths = match (&args.a, &args.b) {
        (dir, None) if dir.is_dir() => [dir.join(SAVED_FILES[0]), dir.join(SAVED_FILES[1])],
        (file, None) => {
            return Err(Error::bad_file(
                file,
                format!("compare needs two traces, or one directory holding {} and {}", SAVED_FILES[0], SAVED_FILES[1]),
                "give the DDP trace as a second argument",
            ))
        }
        (a, Some(b)) => [a.clone(), b.clone()],
    };
    for p in &paths {
        if !p.is_file() {
            let what = crate::error::what_is(p);
            return Err(Error::bad_file(p, format!("trace {what}"), "pass a .safetensors trace file"));
        }
    }
    if std::fs::canonicalize(&paths[0]).ok() == std::fs::canonicalize(&paths[1]).ok() {
        return Err(Error::bad_file(&paths[1], "is the same file as A", "compare two different runs' traces"));
    }
    if let Some(big) = &args.big_batch {
        if !big.is_file() {
            return Err(Error::bad_file(
                big,
                format!("trace {}", crate::error::what_is(big)),
                "pass --big-batch FILE.safetensors",
            ));
        }
    }
    if let Some(control) = &args.control {
        if !control.is_file() {
            return Err(Error::bad_file(
                control,
                format!("trace {}", crate::error::what_is(control)),
                "pass --control FILE.safetensors (the accumulation run recorded again with DDP_VERIFY_PERTURB set)",
            ));
        }
    }
    // A --save-trace folder holds the control run's trace where one ran: judged with it.
    let control = args.control.clone().or_else(|| match (&args.a, &args.b) {
        (dir, None) => Some(dir.join(crate::evidence::CONTROL_FILE)).filter(|p| p.is_file()),
        _ => None,
    });
    // And the precision control's, where a narrow dtype's rounding was measured.
    let saved = |name: &str| match (&args.a, &args.b) {
        (dir, None) => Some(dir.join(name)).filter(|p| p.is_file()),
        _ => None,
    };
    let (precision, precision_ddp) =
        (saved(crate::evidence::PRECISION_FILE), saved(crate::evidence::PRECISION_DDP_FILE));
    let tolerance = checked_overrides(&args.tolerance)?;
    let reports = reports(&args.reports)?;
    crate::report::check_targets(&reports, args.plot.as_ref(), args.force)?;
    Ok(CompareOptions {
        paths,
        big: args.big_batch.clone(),
        control,
        precision,
        precision_ddp,
        tolerance,
        reports,
        plot: args.plot.clone(),
        strict_buffers: args.strict_buffers,
    })
}
