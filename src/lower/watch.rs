//! `ddp-verify watch -- COMMAND`: the command as written, its Python, where its trace goes;
//! or `watch --trace FILE`: a run recorded before.

use ddp_verify_cli::WatchArgs;

use super::reports;
use crate::error::{Error, Result};
use crate::spec::WatchOptions;

pub fn watch(args: &WatchArgs) -> Result<WatchOptions> {
    let reports = reports(&args.reports)?;
    crate::report::check_targets(&reports, None, args.force)?;
    if let Some(trace) = &args.trace {
        if !trace.is_file() {
            return Err(Error::bad_file(trace, "is no file", "give --trace the .safetensors file a run recorded"));
        }
        return Ok(WatchOptions {
            recorded: Some(trace.clone()),
            command: Vec::new(),
            python: String::new(),
            out: trace.parent().map(|p| p.to_path_buf()).unwrap_or_default(),
            timeout: args.timeout,
            exit_grace: args.exit_grace,
            stop_on_fault: false,
            reports,
        });
    }
    let python = crate::jobs::launcher::python_of(&args.script[0]);
    let out = match &args.save_trace {
        Some(dir) => {
            crate::outputs::check_dir("--save-trace", dir, true)?;
            if let (Some(p), false) =
                (crate::jobs::watch::WATCH_FILES.iter().map(|f| dir.join(f)).find(|p| p.exists()), args.force)
            {
                return Err(Error::bad_file(
                    &p,
                    "exists",
                    "pass --force to replace it, or choose another --save-trace",
                ));
            }
            dir.to_path_buf()
        }
        None => tempfile::Builder::new()
            .prefix("ddp-verify-watch-")
            .tempdir()
            .map_err(|e| Error::io("creating a directory for the run's trace", e))?
            .keep(),
    };
    Ok(WatchOptions {
        recorded: None,
        command: args.script.clone(),
        python,
        out,
        timeout: args.timeout,
        exit_grace: args.exit_grace,
        stop_on_fault: args.stop_on_fault,
        reports,
    })
}
