//! `ddp-verify watch -- COMMAND`: the user's launch command run once, exactly as written,
//! recorded with no edit (the hook Python loads at start-up), and that one run judged by each
//! stage's contract (`judge::watch`). No second training: the run checked is the run that
//! trains.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::script::{autoload_dir, lingered_words, quoted, refused_setting, stopped};
use crate::error::{Error, Exit, Result};
use crate::spec::WatchOptions;

pub fn command(o: &WatchOptions) -> Result<Exit> {
    let watched = run(o)?;
    crate::report::watch::write_all(&watched, &o.reports)?;
    Ok(watched.exit())
}

/// Runs the command and judges its trace.
pub fn run(o: &WatchOptions) -> Result<crate::judge::Watched> {
    std::fs::create_dir_all(&o.out).map_err(|e| Error::io(format!("creating {}", o.out.display()), e))?;
    let [trace_name, log_name] = crate::lower::WATCH_FILES;
    let (trace, log) = (o.out.join(trace_name), o.out.join(log_name));
    let _ = std::fs::remove_file(&trace);
    let autoload = autoload_dir(&o.python)?;
    let mut cmd = Command::new(&o.command[0]);
    cmd.args(&o.command[1..]);
    let path = std::env::var_os("PYTHONPATH").map_or(autoload.as_os_str().to_owned(), |p| {
        let mut joined = autoload.as_os_str().to_owned();
        joined.push(":");
        joined.push(p);
        joined
    });
    cmd.env("PYTHONPATH", path).env("DDP_VERIFY_TRACE", &trace).env("DDP_VERIFY_LEG", "ddp");
    let what = format!("the run ({})", o.command.join(" "));
    let counted = o.out.join("watch.progress");
    cmd.env(super::progress::ENV, &counted);
    let mut progress = super::progress::LegProgress::new("watched", counted, None, false);
    eprintln!("ddp-verify: watching {what}; its output goes to {}", log.display());
    let started = std::time::Instant::now();
    let timeout = Duration::try_from_secs_f64(o.timeout).unwrap_or(Duration::MAX);
    let grace = Duration::try_from_secs_f64(o.exit_grace).unwrap_or(Duration::MAX);
    let done = || trace.is_file();
    let ended = ddp_verify_launch::run_leg(cmd, &log, timeout, &what, &mut |t| progress.tick(t), Some((&done, grace)));
    progress.clear();
    for suffix in [".part", ".part2"] {
        let mut part = trace.as_os_str().to_owned();
        part.push(suffix);
        let _ = std::fs::remove_file(part);
    }
    let mut notes = Vec::new();
    let status = ended.map(|(status, lingered)| {
        if let Some(l) = lingered {
            notes.push(lingered_words("watched", &l));
        }
        status
    })?;
    let written = trace.is_file();
    match (status.success(), written) {
        (true, true) => {}
        (false, true) => eprintln!(
            "ddp-verify: warning: {what} failed after writing its trace ({status}: {}); judged from the complete trace",
            quoted(&log)
        ),
        (true, false) => return Err(unrecorded(&what, &log)),
        (false, false) => {
            return Err(Error::Launcher {
                problem: format!("{what} failed ({status}): {}", quoted(&log)),
                fix: format!("see its log, {}", log.display()),
            })
        }
    }
    let _ = progress.done(started.elapsed());
    let t = crate::evidence::Trace::load(&trace)?;
    eprintln!("ddp-verify: the run's trace and log are in {}", o.out.display());
    Ok(crate::judge::watch(t, notes))
}

/// A run that ended well and left no trace: the recorder refused a setting, stopped, or saw
/// no optimizer step.
fn unrecorded(what: &str, log: &Path) -> Error {
    if let Some(line) = refused_setting(log) {
        return Error::bad_flag(
            "--",
            format!("{what} ran unrecorded: {line}"),
            "fix the setting it names, or unset it",
        );
    }
    if let Some(line) = stopped(log) {
        return Error::Launcher {
            problem: format!("{what} trained, but its recording stopped: {line}"),
            fix: format!("the training went on unrecorded; its log: {}", log.display()),
        };
    }
    Error::bad_flag(
        "--",
        format!("{what} finished but recorded no optimizer step (log: {})", log.display()),
        "check that the script trains (calls optimizer.step()) with these arguments",
    )
}
