//! `ddp-verify --acc-steps K --gpus W -- python train.py ARGS`: the user's own script as the
//! accumulation leg (one process) and the DDP leg (torchrun, W processes), recorded with no
//! edit by the `ddp_verify_trace` hook Python loads at start-up, then judged as `compare`;
//! where the arguments take `{batch}`, also as one big batch of each step's samples.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::error::{Error, Exit, Result};
use crate::judge::Outcome;
use crate::spec::ScriptOptions;

/// One leg: its name (the trace's `leg` header), processes, micro-batches per process, and
/// the batch size each micro-batch has.
#[derive(Clone, Copy)]
struct Leg {
    name: &'static str,
    world: usize,
    local_acc_steps: usize,
    batch: usize,
}

/// The big-batch trace, beside the two `--save-trace` names.
pub const BIG_BATCH_FILE: &str = "big-batch.safetensors";

pub fn command(o: &ScriptOptions) -> Result<Exit> {
    match run(o)? {
        Some(outcome) => {
            crate::report::write_all(&outcome, &o.compare.reports)?;
            Ok(outcome.exit())
        }
        None => Ok(Exit::Equivalent),
    }
}

/// Runs the legs and judges them; None on a node other than 0 (node 0 judges).
pub fn run(o: &ScriptOptions) -> Result<Option<Outcome>> {
    run_with(o, &autoload_dir(&o.launcher.python)?)
}

/// As [`run`], with the recorder's start-up folder already found (explore finds it once).
pub fn run_with(o: &ScriptOptions, autoload: &Path) -> Result<Option<Outcome>> {
    std::fs::create_dir_all(&o.out).map_err(|e| Error::io(format!("creating {}", o.out.display()), e))?;
    let b = o.batch_size;
    let mut legs = vec![
        (Leg { name: "accumulation", world: 1, local_acc_steps: o.acc_steps, batch: b }, o.compare.paths[0].clone()),
        (
            Leg { name: "ddp", world: o.gpus, local_acc_steps: o.acc_steps / o.gpus, batch: b },
            o.compare.paths[1].clone(),
        ),
    ];
    // A script that takes its batch size from {batch} can also run as one big batch of each
    // step's K·B samples: the third trace, where a per-micro-batch mean shows.
    let mut compare = o.compare.clone();
    if big_batch_reaches(&o.launcher.script) {
        let big = o.out.join(BIG_BATCH_FILE);
        legs.push((
            Leg { name: "big-batch", world: 1, local_acc_steps: 1, batch: b.saturating_mul(o.acc_steps) },
            big.clone(),
        ));
        compare.big = Some(big);
    }
    if o.launcher.nodes > 1 {
        if o.node_rank > 0 {
            // This node's share of the DDP leg is all it runs; node 0 judges.
            let (leg, trace) = &legs[1];
            run_leg(o, leg, autoload, trace, None, None, &mut Vec::new())?;
            return Ok(None);
        }
        // The nodes meet in the DDP leg first: the others wait in its rendezvous, not
        // behind this node's other legs.
        legs.swap(0, 1);
    }
    let mut steps = None;
    let mut notes = Vec::new();
    let mut folder = super::workdir::Folder::watch(&o.out);
    for (leg, trace) in &legs {
        folder.before(leg.name);
        let made = run_leg(o, leg, autoload, trace, steps, None, &mut notes)?;
        folder.after(leg.name);
        steps = steps.or(made);
    }
    let mut outcome = super::compare::judge_traces(&compare)?;
    // A leg that ran narrower than float32 where the legs may round otherwise: the
    // accumulation leg again with each backward at another loss divisor measures that
    // rounding, and the DDP leg's own where the legs reach their precision otherwise
    // (`judge::precision`); the runs are judged against them.
    if let Some(wanted) = outcome.precision_wanted {
        let by = wanted.divisor;
        if !o.quiet {
            let whose = if wanted.both { "each leg again" } else { "the accumulation leg again" };
            eprintln!(
                "ddp-verify: a leg ran in low precision where the legs may round otherwise: running the precision \
                 control ({whose}, each backward at loss divisor {by}) to measure its rounding"
            );
        }
        let mut controls = vec![("accumulation", "precision-control", crate::evidence::PRECISION_FILE)];
        // Several nodes would each have to run the DDP leg's control in step: not run there
        // (the judge then says the control is missing).
        if wanted.both && o.launcher.nodes == 1 {
            controls.push(("ddp", "precision-control-ddp", crate::evidence::PRECISION_DDP_FILE));
        }
        for (of, name, file) in controls {
            let (leg, _) = legs.iter().find(|(l, _)| l.name == of).expect("the leg");
            let path = o.out.join(file);
            folder.before(name);
            let control = Control::Divisor(by);
            run_leg(o, &Leg { name, ..*leg }, autoload, &path, steps, Some(control), &mut notes)?;
            folder.after(name);
            match of {
                "ddp" => compare.precision_ddp = Some(path),
                _ => compare.precision = Some(path),
            }
        }
        outcome = super::compare::judge_traces(&compare)?;
    }
    // Runs that part after step 0 with no recorded fact apart: the accumulation leg again,
    // nudged, measures whether rounding explains it (`judge::control`).
    let outcome = match outcome.control_wanted {
        Some(scale) => {
            let (leg, _) = legs.iter().find(|(l, _)| l.name == "accumulation").expect("the accumulation leg");
            let control = o.out.join(crate::evidence::CONTROL_FILE);
            if !o.quiet {
                eprintln!(
                    "ddp-verify: the runs part after step 0 with no recorded fact apart: running a control (the \
                     accumulation leg, its gradients nudged by {scale:.1e}) to tell rounding from a bug"
                );
            }
            folder.before("control");
            let nudge = Some(Control::Perturb(scale));
            run_leg(o, &Leg { name: "control", ..*leg }, autoload, &control, steps, nudge, &mut notes)?;
            folder.after("control");
            compare.control = Some(control);
            super::compare::judge_traces(&compare)?
        }
        None => outcome,
    };
    folder.finish(&mut notes);
    let mut outcome = outcome;
    notes.extend(recorded_notes(&outcome));
    outcome.notes = notes;
    if !o.quiet {
        eprintln!("ddp-verify: the legs' traces and logs are in {}", o.out.display());
    }
    Ok(Some(outcome))
}

/// What the recorder did to the legs at ddp-verify's asking, from their headers: dropout
/// made the identity, CUDA run on the CPU.
fn recorded_notes(o: &Outcome) -> Vec<String> {
    let mut notes = Vec::new();
    for (label, t) in [(&o.runs.left, &o.accumulation), (&o.runs.right, &o.ddp)] {
        if let Some(off) = &t.header.dropout_off {
            notes.push(format!("{label}: {off}; the check holds for the script without dropout"));
        }
        if let Some(mapped) = &t.header.device_mapped {
            notes.push(format!("{label}: ran on the CPU with gloo (--device cpu): {mapped}"));
        }
    }
    notes
}

/// Whether the command can be told to run one big batch per step: it takes {batch}, and K
/// only as {local_acc_steps} (1 in that leg). A script given {acc_steps} is told K there
/// too, and would accumulate K big batches a step.
fn big_batch_reaches(args: &[String]) -> bool {
    let takes = |p: &str| args.iter().any(|a| a.contains(p));
    takes("{batch}") && !takes("{acc_steps}")
}

/// The folder whose sitecustomize.py starts the recording, from the script's own Python:
/// the recorder must be importable there.
pub fn autoload_dir(python: &str) -> Result<PathBuf> {
    // Found, not imported: importing it imports torch, seconds that every run (and every
    // case of explore) would pay for nothing; the legs import it anyway.
    let code = "import importlib.util, os, sys; s = importlib.util.find_spec('ddp_verify_trace'); \
                sys.exit(1) if s is None else print(os.path.join(list(s.submodule_search_locations)[0], 'autoload'))";
    let out = Command::new(python).args(["-c", code]).output();
    let fix = "install the recorder into that Python (pip install the ddp-verify wheel, docs/install.md)";
    match out {
        Ok(o) if o.status.success() => Ok(PathBuf::from(String::from_utf8_lossy(&o.stdout).trim())),
        Ok(_) => Err(Error::bad_flag("--", format!("{python} cannot import ddp_verify_trace"), fix)),
        Err(e) => Err(Error::bad_flag("--", format!("cannot run {python} ({e})"), "give the Python that trains")),
    }
}

/// The command for a leg: its placeholders filled in, its launcher starting `leg.world`
/// processes (plain Python's DDP leg under torchrun).
fn leg_command(o: &ScriptOptions, leg: &Leg) -> Vec<String> {
    let fill = |a: &String| {
        let ours = a
            .replace("{acc_steps}", &o.acc_steps.to_string())
            .replace("{local_acc_steps}", &leg.local_acc_steps.to_string())
            .replace("{gpus}", &o.gpus.to_string())
            .replace("{batch}", &leg.batch.to_string())
            .replace("{world}", &leg.world.to_string())
            .replace("{leg}", leg.name);
        o.fills.iter().fold(ours, |a, (name, value)| a.replace(&format!("{{{name}}}"), value))
    };
    super::launcher::argv(&o.launcher, leg.world).iter().map(fill).collect()
}

/// What makes the accumulation leg a control run.
#[derive(Clone, Copy)]
enum Control {
    /// Each step's gradients nudged by this fraction (`judge::control`).
    Perturb(f64),
    /// Each backward at DDP's loss divisor, this ratio (`judge::precision`).
    Divisor(f64),
}

/// Runs one leg, with its progress line; the optimizer steps it made, where recorded.
/// `nudge`: what makes it a control run.
fn run_leg(
    o: &ScriptOptions,
    leg: &Leg,
    autoload: &Path,
    trace: &Path,
    of: Option<usize>,
    nudge: Option<Control>,
    notes: &mut Vec<String>,
) -> Result<Option<usize>> {
    let argv = leg_command(o, leg);
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    cmd.env("PYTHONPATH", pythonpath(autoload))
        .env("DDP_VERIFY_TRACE", trace)
        // A control is its leg again, and its trace says so.
        .env(
            "DDP_VERIFY_LEG",
            match (nudge, leg.world) {
                (None, _) => leg.name,
                (Some(_), 1) => "accumulation",
                (Some(_), _) => "ddp",
            },
        )
        .env("DDP_VERIFY_ACC_STEPS", o.acc_steps.to_string())
        .env("DDP_VERIFY_LOCAL_ACC_STEPS", leg.local_acc_steps.to_string())
        .env("DDP_VERIFY_WORLD", o.gpus.to_string())
        .env("DDP_VERIFY_BATCH", leg.batch.to_string());
    if let Some(n) = &o.sample {
        cmd.env("DDP_VERIFY_SAMPLE", n);
    }
    match nudge {
        Some(Control::Perturb(x)) => cmd.env(crate::evidence::schema::PERTURB_ENV, format!("{x:e}")),
        Some(Control::Divisor(w)) => cmd.env(crate::evidence::schema::DIVISOR_ENV, format!("{w}")),
        None => &mut cmd,
    };
    if o.no_dropout {
        cmd.env(crate::evidence::schema::NO_DROPOUT_ENV, "1");
    }
    if o.cpu {
        cmd.env(crate::evidence::schema::DEVICE_ENV, "cpu");
    }
    if std::env::var_os("OMP_NUM_THREADS").is_none() {
        cmd.env("OMP_NUM_THREADS", "1");
    }
    // Another node's ranks write no trace: node 0's rank 0 writes it, maybe into this folder.
    let node = o.node_rank;
    let mine = if node == 0 { leg.name.to_string() } else { format!("{}.node{node}", leg.name) };
    if node == 0 {
        let _ = std::fs::remove_file(trace);
    }
    let log = o.out.join(format!("{mine}.log"));
    let what = match node {
        0 => format!("the {} leg ({})", leg.name, argv.join(" ")),
        _ => format!("node {node}'s share of the {} leg ({})", leg.name, argv.join(" ")),
    };
    let timeout = Duration::try_from_secs_f64(o.timeout).unwrap_or(Duration::MAX);
    let counted = o.out.join(format!("{mine}.progress"));
    cmd.env(super::progress::ENV, &counted);
    let mut progress = super::progress::LegProgress::new(leg.name, counted, of, o.quiet);
    let started = std::time::Instant::now();
    // Node 0 knows when the leg's work is done: its trace, renamed into place whole.
    let done = || trace.is_file();
    let grace = Duration::try_from_secs_f64(o.exit_grace).unwrap_or(Duration::MAX);
    let watch = (node == 0).then_some((&done as &dyn Fn() -> bool, grace));
    let ended = ddp_verify_launch::run_leg(cmd, &log, timeout, &what, &mut |t| progress.tick(t), watch);
    progress.clear();
    let status = ended.map(|(status, lingered)| {
        if let Some(l) = lingered {
            notes.push(lingered_words(leg.name, &l));
        }
        status
    });
    if node > 0 {
        return match status?.success() {
            true => {
                let t = started.elapsed().as_secs_f64();
                eprintln!(
                    "ddp-verify: node {node}: its share of the {} leg ended in {t:.1} s; node 0 judges",
                    leg.name
                );
                Ok(None)
            }
            false => Err(Error::Launcher {
                problem: format!("{what} failed: {}", quoted(&log)),
                fix: format!("see its log, {}", log.display()),
            }),
        };
    }
    // The leg is gone, whatever its end: a trace it was still streaming (stopped at the
    // deadline or by Ctrl-C, which run no cleanup of the recorder's) goes with it.
    remove_parts(trace);
    let status = status?;
    let written = trace.is_file() || (status.success() && leg.world > 1 && o.launcher.nodes > 1 && arrives(trace));
    match (status.success(), written) {
        (true, true) => Ok(progress.done(started.elapsed())),
        (true, false) if refused_setting(&log).is_some() => Err(Error::bad_flag(
            "--",
            format!("{what} ran unrecorded: {}", refused_setting(&log).unwrap_or_default()),
            "fix the setting it names (DDP_VERIFY_SAMPLE, DDP_VERIFY_MAGNITUDES or --sample), or unset it",
        )),
        (true, false) if stopped(&log).is_some() => Err(Error::Launcher {
            problem: format!("{what} trained, but its recording stopped: {}", stopped(&log).unwrap_or_default()),
            fix: format!("the training went on unrecorded; its log: {}", log.display()),
        }),
        (true, false) => Err(Error::bad_flag(
            "--",
            format!("{what} finished but recorded no optimizer step (log: {})", log.display()),
            "check that the script trains (calls optimizer.step()) with these arguments",
        )),
        // The trace is written at interpreter exit only when no exception ended the script,
        // renamed into place whole: a failure after it (gloo's known abort at exit,
        // "terminate called without an active exception") leaves a complete run.
        (false, true) => {
            eprintln!(
                "ddp-verify: warning: {what} failed after writing its trace ({status}: {}); judged from the complete trace",
                quoted(&log)
            );
            Ok(progress.done(started.elapsed()))
        }
        (false, _) => Err(Error::Launcher {
            problem: format!("{what} failed ({status}): {}", quoted(&log)),
            fix: format!("see its log, {}", log.display()),
        }),
    }
}

/// PYTHONPATH with the recorder's start-up folder first, ahead of the caller's own.
pub(super) fn pythonpath(autoload: &Path) -> std::ffi::OsString {
    let mut joined = autoload.as_os_str().to_owned();
    if let Some(p) = std::env::var_os("PYTHONPATH") {
        joined.push(":");
        joined.push(p);
    }
    joined
}

/// What the recorder was still streaming into `trace` when its run went (stopped at a
/// deadline, a fault or Ctrl-C, which run no cleanup of the recorder's).
pub(super) fn remove_parts(trace: &Path) {
    for suffix in [".part", ".part2"] {
        let mut part = trace.as_os_str().to_owned();
        part.push(suffix);
        let _ = std::fs::remove_file(part);
    }
}

/// A leg stopped after its trace was complete, in words: who lingered, and where.
pub(super) fn lingered_words(leg: &str, l: &ddp_verify_launch::Lingered) -> String {
    let who: Vec<String> = l
        .processes
        .iter()
        .map(|p| {
            let name = p.rank.map_or(format!("{} (pid {})", p.name, p.pid), |r| format!("rank {r} (pid {})", p.pid));
            p.waiting_in.as_ref().map_or(name.clone(), |w| format!("{name}, waiting in {w}"))
        })
        .collect();
    let who = if who.is_empty() { "its processes".to_string() } else { who.join("; ") };
    format!(
        "the {leg} leg was still running {:.0} s after its trace was complete (--exit-grace): {who}. Its training had \
         ended (the trace is complete), so what hung or went on was after it: the script's own process-group \
         teardown, the interpreter's exit, or work after training. It was stopped and the complete trace judged; \
         raise --exit-grace if the script has work to finish after training",
        l.after.as_secs_f64()
    )
}

/// Across nodes, global rank 0 may be another node's (a c10d rendezvous ranks the nodes as
/// they arrive): its trace reaches the shared --save-trace folder when that rank is done,
/// maybe after this node's share ended. It is renamed into place whole, so being there is
/// being complete.
fn arrives(trace: &Path) -> bool {
    let until = std::time::Instant::now() + Duration::from_secs(120);
    while std::time::Instant::now() < until {
        if trace.is_file() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    false
}

/// The recorder's refusal of its settings at start-up, where the log has one: Python prints
/// "Error in sitecustomize", then the error's line, and runs the script unrecorded.
pub(super) fn refused_setting(log: &Path) -> Option<String> {
    let text = std::fs::read_to_string(log).ok()?;
    let mut lines = text.lines().skip_while(|l| !l.starts_with("Error in sitecustomize"));
    lines.next()?;
    lines.find(|l| l.contains("ddp_verify_trace:")).map(|l| l.trim().to_string())
}

/// The recorder's own line where an exception stopped it (the training went on), if any.
pub(super) fn stopped(log: &Path) -> Option<String> {
    let text = std::fs::read_to_string(log).ok()?;
    text.lines().find(|l| l.contains(crate::evidence::schema::STOPPED)).map(|l| l.trim().to_string())
}

/// The log's exception, by the rank that raised it, where it has one; else its last line.
pub(super) fn quoted(log: &Path) -> String {
    super::failure::quote(&std::fs::read_to_string(log).unwrap_or_default())
}
