//! `ddp-verify watch -- COMMAND`: the user's launch command run once, exactly as written,
//! recorded with no edit (the hook Python loads at start-up), and that one run judged by each
//! stage's contract (`judge::watch`). No second training: the run checked is the run that
//! trains.

use std::cell::{Cell, RefCell};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use super::script::{autoload_dir, lingered_words, pythonpath, quoted, refused_setting, remove_parts, stopped};
use crate::error::{Error, Exit, Result};
use crate::spec::WatchOptions;

/// What `watch` keeps in its folder: the trace, the run's log, and (`--stop-on-fault`) the
/// steps' small traces.
pub const WATCH_FILES: [&str; 3] = ["watch.safetensors", "watch.log", "watch.steps"];

pub fn command(o: &WatchOptions) -> Result<Exit> {
    let watched = run(o)?;
    crate::report::watch::write_all(&watched, &o.reports)?;
    Ok(watched.exit())
}

/// Runs the command and judges its trace (or judges the trace given by `--trace`).
pub fn run(o: &WatchOptions) -> Result<crate::judge::Watched> {
    if let Some(recorded) = &o.recorded {
        return Ok(crate::judge::watch(crate::evidence::Trace::load(recorded)?, Vec::new()));
    }
    std::fs::create_dir_all(&o.out).map_err(|e| Error::io(format!("creating {}", o.out.display()), e))?;
    let [trace_name, log_name, steps_name] = WATCH_FILES;
    let (trace, log, steps) = (o.out.join(trace_name), o.out.join(log_name), o.out.join(steps_name));
    let _ = std::fs::remove_file(&trace);
    let _ = std::fs::remove_dir_all(&steps);
    let autoload = autoload_dir(&o.python)?;
    let mut cmd = Command::new(&o.command[0]);
    cmd.args(&o.command[1..]);
    cmd.env("PYTHONPATH", pythonpath(&autoload)).env("DDP_VERIFY_TRACE", &trace).env("DDP_VERIFY_LEG", "ddp");
    if o.stop_on_fault {
        cmd.env(crate::evidence::schema::STEP_FILE_ENV, &steps);
    }
    let what = format!("the run ({})", o.command.join(" "));
    let counted = o.out.join("watch.progress");
    cmd.env(super::progress::ENV, &counted);
    let mut progress = super::progress::LegProgress::new("watched", counted, None, false);
    eprintln!("ddp-verify: watching {what}; its output goes to {}", log.display());
    let started = std::time::Instant::now();
    let timeout = Duration::try_from_secs_f64(o.timeout).unwrap_or(Duration::MAX);
    let grace = Duration::try_from_secs_f64(o.exit_grace).unwrap_or(Duration::MAX);
    // Done: the trace complete for --exit-grace (a rank hung at exit), or, --stop-on-fault,
    // a step that broke a contract in the steps rank 0 rewrites as it trains.
    let complete_since = Cell::new(None::<Instant>);
    let fault = RefCell::new(None::<crate::judge::Watched>);
    let done = || {
        if trace.is_file() {
            let since = complete_since.get().unwrap_or_else(Instant::now);
            complete_since.set(Some(since));
            return since.elapsed() >= grace;
        }
        if o.stop_on_fault {
            if let Some(w) = judge_steps(&steps) {
                *fault.borrow_mut() = Some(w);
                return true;
            }
        }
        false
    };
    let ended =
        ddp_verify_launch::run_leg(cmd, &log, timeout, &what, &mut |t| progress.tick(t), Some((&done, Duration::ZERO)));
    progress.clear();
    remove_parts(&trace);
    // A step's small trace being written when the run was stopped: named `.step-*`.
    for f in std::fs::read_dir(&steps).into_iter().flatten().filter_map(|e| e.ok()) {
        if f.file_name().to_string_lossy().starts_with(".step-") {
            let _ = std::fs::remove_file(f.path());
        }
    }
    let mut notes = Vec::new();
    let stopped_at_fault = fault.borrow_mut().take();
    let status = ended.map(|(status, lingered)| {
        match (lingered, &stopped_at_fault) {
            (Some(l), Some(_)) => notes.push(stopped_words(&l, reached(&steps))),
            // Stopped once the trace had been complete for --exit-grace.
            (Some(l), None) => {
                notes.push(lingered_words("watched", &ddp_verify_launch::Lingered { after: grace, ..l }))
            }
            (None, _) => {}
        }
        status
    })?;
    if let Some(mut w) = stopped_at_fault {
        let _ = progress.done(started.elapsed());
        eprintln!(
            "ddp-verify: the run was stopped at its first broken contract; its log and steps are in {}",
            o.out.display()
        );
        w.notes.extend(notes);
        return Ok(w);
    }
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

/// The steps rank 0 wrote since the last look, judged in order, each once (and removed once
/// judged): Some at the first that broke a contract. A file being written is not yet named;
/// one unreadable is left for the next look.
fn judge_steps(steps: &Path) -> Option<crate::judge::Watched> {
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(steps)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("step-")))
        .collect();
    files.sort();
    for f in files {
        let t = crate::evidence::Trace::load(&f).ok()?;
        let w = crate::judge::watch(t, Vec::new());
        if w.fault.is_some() {
            return Some(w);
        }
        let _ = std::fs::remove_file(&f);
    }
    None
}

/// The optimizer steps the run had made when it was stopped: its latest step file's, and one.
fn reached(steps: &Path) -> Option<usize> {
    let names = std::fs::read_dir(steps).ok()?.filter_map(|e| e.ok()?.file_name().into_string().ok());
    names
        .filter_map(|n| n.strip_prefix("step-")?.strip_suffix(".safetensors")?.parse::<usize>().ok())
        .max()
        .map(|s| s + 1)
}

/// A run stopped at its first broken contract, in words: who was stopped, and when.
fn stopped_words(l: &ddp_verify_launch::Lingered, reached: Option<usize>) -> String {
    let who: Vec<String> = l
        .processes
        .iter()
        .map(|p| p.rank.map_or(format!("{} (pid {})", p.name, p.pid), |r| format!("rank {r} (pid {})", p.pid)))
        .collect();
    let who = if who.is_empty() { "its processes".to_string() } else { who.join(", ") };
    let when = reached.map_or(String::new(), |n| format!(" after {n} optimizer step(s)"));
    format!(
        "--stop-on-fault: the run was stopped{when}, at the first step that broke a contract as the steps were \
         judged while it trained; stopped: {who}. Nothing of it is left running; it wrote no trace of its own, \
         and the steps judged are in watch.steps/"
    )
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
