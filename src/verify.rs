//! The main job: both runs, their comparison, and the golden check.

use std::path::{Path, PathBuf};

use crate::collective::Collective;
use crate::compare::{diagnose, Comparer, Comparison, Diagnosis, Verdict};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::golden::{self, Golden};
use crate::runs::{self, launch, StepGrads};
use crate::trace::{Params, Trace, TraceWriter};

pub struct Outcome {
    pub config: Config,
    pub accumulation: Trace,
    pub ddp: Trace,
    /// Accumulation vs DDP: the claim under test.
    pub runs: Comparison,
    /// Each run against the golden's trace of the same run, when `--golden` is given.
    pub golden: Vec<Comparison>,
    /// Which golden, and what made it.
    pub golden_torch: Option<String>,
    /// Likely cause of an accumulation/DDP mismatch, in plain words.
    pub diagnosis: Option<Diagnosis>,
}

impl Outcome {
    pub fn verdict(&self) -> Verdict {
        self.golden.iter().map(|c| c.verdict).fold(self.runs.verdict, Verdict::max)
    }
}

const TRACE_FILES: [&str; 3] = ["accumulation.safetensors", "ddp.safetensors", "report.json"];

/// Inside an MPI world (ours, started by `ddp-verify`, or a user's `mpirun`): every
/// process is a DDP rank; rank 0 also runs accumulation on a thread of its own and returns
/// the outcome, the others return None.
pub fn verify_in_world(cfg: &Config) -> Result<Option<Outcome>> {
    let rank = launch::init_rank()?;
    crate::profile::mark("mpi initialised");
    let is_root = rank.comm.rank() == 0;
    launch::fault_hooks(rank.comm.rank());
    // Rank 0 alone validates and reads the golden; it tells the others whether to go on,
    // so a refusal there never leaves them waiting in a collective.
    let golden = if is_root { prepare(cfg) } else { Ok(None) };
    let mut go = [if golden.is_ok() { 1.0f32 } else { 0.0 }];
    rank.comm.broadcast(&mut go, 0)?;
    let golden = golden?;
    if go[0] == 0.0 {
        return Err(Error::FollowerStopped);
    }
    // Past the go-ahead every rank is in the collectives: a failure must end them all.
    let result = go_ahead(cfg, &rank, golden);
    rank.fail_all(result)
}

fn go_ahead(cfg: &Config, rank: &launch::MpiRank, golden: Option<Golden>) -> Result<Option<Outcome>> {
    let is_root = rank.comm.rank() == 0;
    let comm = launch::rank_collective(&cfg.train, &rank.comm)?;
    launch::failure_hook(rank.comm.rank())?;
    crate::profile::mark("prepared");
    if cfg.train.lockstep {
        return lockstep(cfg, comm.as_ref(), golden);
    }
    if !is_root {
        runs::ddp_rank(&cfg.train, comm.as_ref())?;
        return Ok(None);
    }
    // Free-running, the two runs share nothing until compared: side by side.
    let (accumulation, ddp) = std::thread::scope(|scope| {
        let accumulation = scope.spawn(|| {
            launch::pin_threads();
            runs::accumulation(&cfg.train)
        });
        let ddp = runs::ddp_rank(&cfg.train, comm.as_ref());
        (accumulation.join().expect("the accumulation thread does not panic"), ddp)
    });
    finish(cfg, accumulation?, ddp?, golden).map(Some)
}

/// Above this many bytes of gradients over all steps, lockstep compares each step as it
/// comes and keeps none (unless blessing; `--save-trace` streams them to disk).
const KEEP_STEPS_BYTES: f64 = 64.0 * 1024.0 * 1024.0;

/// Both runs in lockstep; every comparison streams step by step.
fn lockstep(cfg: &Config, comm: &dyn Collective, golden: Option<Golden>) -> Result<Option<Outcome>> {
    let (mut runs_cmp, mut gold_cmps) = comparers(cfg, golden.as_ref());
    let steps = crate::sampler::optimizer_steps(&cfg.train) as f64;
    let mut keep = None;
    // --save-trace streams each step to disk as it comes.
    // Rank 0 alone writes: the others would open the same files.
    let mut writers = match cfg.save_trace.as_ref().filter(|_| comm.rank() == 0) {
        Some(dir) => {
            std::fs::create_dir_all(dir).map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
            Some([TraceWriter::create(&dir.join(TRACE_FILES[0]))?, TraceWriter::create(&dir.join(TRACE_FILES[1]))?])
        }
        None => None,
    };
    let (mut kept_acc, mut kept_ddp) = (Vec::new(), Vec::new());
    let none = Params::new();
    let mut sink = |s: usize, step: StepGrads| -> Result<()> {
        let StepGrads { accumulation: a, ddp: d, allowed } = step;
        runs_cmp.step(&a, &d, &allowed);
        if let (Some([ga, gd]), Some(g)) = (gold_cmps.as_mut(), golden.as_ref()) {
            ga.step(&a, g.accumulation.steps.get(s).unwrap_or(&none), &none);
            gd.step(&d, g.ddp.steps.get(s).unwrap_or(&none), &none);
        }
        if let Some([wa, wd]) = writers.as_mut() {
            wa.step(s, &a)?;
            wd.step(s, &d)?;
        }
        // Decided on the first step's real size: both runs' gradients over every step.
        let bytes = |p: &Params| p.iter().map(|(_, t)| t.numel() * t.kind().elt_size_in_bytes()).sum::<usize>();
        if *keep.get_or_insert_with(|| cfg.bless || 2.0 * bytes(&a) as f64 * steps <= KEEP_STEPS_BYTES) {
            kept_acc.push(a);
            kept_ddp.push(d);
        }
        Ok(())
    };
    let Some((mut acc, mut ddp)) = runs::lockstep(&cfg.train, comm, &mut sink)? else {
        return Ok(None);
    };
    crate::profile::mark("runs finished");
    let strict = cfg.strict_buffers;
    let runs = runs_cmp.finish(&acc, &ddp, strict);
    crate::profile::mark("runs compared");
    let golden_cmps = match (gold_cmps, &golden) {
        (Some([ga, gd]), Some(g)) => {
            vec![ga.finish(&acc, &g.accumulation.without_steps(), true), gd.finish(&ddp, &g.ddp.without_steps(), true)]
        }
        _ => Vec::new(),
    };
    if let Some([wa, wd]) = writers {
        wa.finish(&acc)?;
        wd.finish(&ddp)?;
    }
    acc.steps = kept_acc.into_iter().filter(|p| !p.is_empty()).collect();
    ddp.steps = kept_ddp.into_iter().filter(|p| !p.is_empty()).collect();
    let outcome = outcome(cfg, acc, ddp, runs, golden_cmps, golden.as_ref());
    crate::profile::mark("diagnosed");
    after(cfg, outcome, true).map(Some)
}

/// Everything that can refuse the run does so before any training starts.
pub fn prepare(cfg: &Config) -> Result<Option<Golden>> {
    cfg.validate()?;
    crate::data::check_fits(&cfg.train)?;
    crate::models::check_init(&cfg.train)?;
    if let Some(dir) = &cfg.save_trace {
        check_writable(dir, cfg.force)?;
    }
    crate::report::check_targets(&cfg.reports, cfg.plot.as_ref(), cfg.force)?;
    if cfg.bless {
        if cfg.golden.is_none() {
            return Err(Error::bad_flag("--bless", "needs --golden DIR to know where to write", "add --golden DIR"));
        }
        if golden::on_ci() {
            return Err(Error::bad_flag(
                "--bless",
                "refusing to write goldens on CI (the CI variable is set)",
                "bless locally, review the files, and commit them",
            ));
        }
        if cfg.train.inject.is_some() {
            return Err(Error::bad_flag("--bless", "refusing to bless a run with an injected bug", "drop --inject"));
        }
        if let Some(dir) = &cfg.golden {
            golden::check_blessable(dir)?;
        }
        return Ok(None);
    }
    cfg.golden.as_deref().map(|d| Golden::load(d, &cfg.train)).transpose()
}

fn check_writable(dir: &Path, force: bool) -> Result<()> {
    crate::outputs::check_dir("--save-trace", dir, true)?;
    if force {
        return Ok(());
    }
    if let Some(f) = TRACE_FILES.iter().map(|f| dir.join(f)).find(|p| p.exists()) {
        return Err(Error::bad_file(
            f,
            "--save-trace would overwrite this file",
            "choose another directory or pass --force",
        ));
    }
    Ok(())
}

fn finish(cfg: &Config, accumulation: Trace, ddp: Trace, golden: Option<Golden>) -> Result<Outcome> {
    after(cfg, assemble(cfg, accumulation, ddp, golden), false)
}

/// Blesses and saves what a finished outcome asks for (`streamed`: the traces of
/// `--save-trace` are already written).
fn after(cfg: &Config, outcome: Outcome, streamed: bool) -> Result<Outcome> {
    if let (true, Some(dir)) = (cfg.bless, &cfg.golden) {
        // Only an equivalent pair of runs is worth recording as the reference.
        if outcome.verdict() != Verdict::Diverged {
            golden::bless(dir, &cfg.train, &outcome.accumulation, &outcome.ddp)?;
        }
    }
    if let Some(dir) = &cfg.save_trace {
        save(dir, &outcome, streamed)?;
    }
    Ok(outcome)
}

/// Compares two finished runs (and the golden); pure, so reports can be tested on
/// committed traces.
pub fn assemble(cfg: &Config, accumulation: Trace, ddp: Trace, golden: Option<Golden>) -> Outcome {
    let (runs_cmp, gold_cmps) = comparers(cfg, golden.as_ref());
    let runs = runs_cmp.finish(&accumulation, &ddp, cfg.strict_buffers);
    let golden_cmps = match (gold_cmps, &golden) {
        (Some([ga, gd]), Some(g)) => {
            vec![ga.finish(&accumulation, &g.accumulation, true), gd.finish(&ddp, &g.ddp, true)]
        }
        _ => Vec::new(),
    };
    outcome(cfg, accumulation, ddp, runs, golden_cmps, golden.as_ref())
}

/// Accumulation vs DDP, and each run vs the golden's trace of it (whose buffers must agree too).
fn comparers(cfg: &Config, golden: Option<&Golden>) -> (Comparer, Option<[Comparer; 2]>) {
    let tol = &cfg.tolerance;
    let gold = golden.map(|g| {
        [
            Comparer::new("accumulation", "golden accumulation", tol, g.meta.sample),
            Comparer::new("ddp", "golden ddp", tol, g.meta.sample),
        ]
    });
    (Comparer::new("accumulation", "ddp", tol, None).derived(cfg.derive_bounds), gold)
}

fn outcome(
    cfg: &Config,
    accumulation: Trace,
    ddp: Trace,
    runs: Comparison,
    golden: Vec<Comparison>,
    g: Option<&Golden>,
) -> Outcome {
    let diagnosis = diagnose(&accumulation, &ddp, &runs, &cfg.train);
    let golden_torch = g.map(|g| match &g.meta.tool_version {
        Some(tool) => format!("{} (blessed by ddp-verify {tool}, libtorch {})", g.dir.display(), g.meta.torch_version),
        None => format!("{} (PyTorch {})", g.dir.display(), g.meta.torch_version),
    });
    Outcome { config: cfg.clone(), accumulation, ddp, runs, golden, golden_torch, diagnosis }
}

fn save(dir: &PathBuf, o: &Outcome, streamed: bool) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    if !streamed {
        o.accumulation.save(&dir.join(TRACE_FILES[0]))?;
        o.ddp.save(&dir.join(TRACE_FILES[1]))?;
    }
    let json = crate::report::Format::Json.exporter().render(o);
    let path = dir.join(TRACE_FILES[2]);
    std::fs::write(&path, json).map_err(|e| Error::io(format!("writing {}", path.display()), e))
}
