//! The main job: both runs, their comparison, and the golden check.

use std::path::{Path, PathBuf};

use crate::collective::Collective;
use crate::compare::{compare, diagnose, Comparison, Diagnosis, Verdict};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::golden::{self, Golden};
use crate::runs::{self, launch};
use crate::trace::Trace;

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

/// Runs accumulation in this process while W MPI ranks run DDP beside it.
pub fn verify(cfg: &Config) -> Result<Outcome> {
    let golden = prepare(cfg)?;
    let workdir = tempfile::tempdir().map_err(|e| Error::io("creating a temporary directory", e))?;
    let timeout = std::time::Duration::from_secs_f64(cfg.timeout_s);
    let pending = launch::spawn_ddp(&cfg.train, workdir.path(), timeout)?;
    let accumulation = runs::accumulation(&cfg.train);
    let ddp = pending.wait()?;
    finish(cfg, accumulation?, ddp, golden)
}

/// Under a user's `mpirun`: every process is a DDP rank; rank 0 also runs accumulation and
/// returns the outcome, the others return None.
pub fn verify_in_world(cfg: &Config) -> Result<Option<Outcome>> {
    let rank = launch::init_rank()?;
    let is_root = rank.comm.rank() == 0;
    // Rank 0 alone validates and reads the golden; it tells the others whether to go on,
    // so a refusal there never leaves them waiting in a collective.
    let golden = if is_root { prepare(cfg) } else { Ok(None) };
    let mut go = [if golden.is_ok() { 1.0f32 } else { 0.0 }];
    rank.comm.broadcast(&mut go, 0)?;
    let golden = golden?;
    if go[0] == 0.0 {
        return Err(Error::FollowerStopped);
    }
    let ddp = runs::ddp_rank(&cfg.train, &rank.comm)?;
    if !is_root {
        return Ok(None);
    }
    let accumulation = runs::accumulation(&cfg.train)?;
    finish(cfg, accumulation, ddp, golden).map(Some)
}

/// Everything that can refuse the run does so before any training starts.
fn prepare(cfg: &Config) -> Result<Option<Golden>> {
    cfg.validate()?;
    crate::data::check_fits(&cfg.train)?;
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
        return Ok(None);
    }
    cfg.golden.as_deref().map(|d| Golden::load(d, &cfg.train)).transpose()
}

fn check_writable(dir: &Path, force: bool) -> Result<()> {
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
    let outcome = assemble(cfg, accumulation, ddp, golden);
    if let (true, Some(dir)) = (cfg.bless, &cfg.golden) {
        // Only an equivalent pair of runs is worth recording as the reference.
        if outcome.verdict() != Verdict::Diverged {
            golden::bless(dir, &cfg.train, &outcome.accumulation, &outcome.ddp)?;
        }
    }
    if let Some(dir) = &cfg.save_trace {
        save(dir, &outcome)?;
    }
    Ok(outcome)
}

/// Compares two finished runs (and the golden); pure, so reports can be tested on
/// committed traces.
pub fn assemble(cfg: &Config, accumulation: Trace, ddp: Trace, golden: Option<Golden>) -> Outcome {
    let tol = &cfg.tolerance;
    let runs = compare("accumulation", &accumulation, "ddp", &ddp, tol);
    let diagnosis = diagnose(&accumulation, &ddp, &runs, crate::sampler::steps_per_epoch(&cfg.train));
    let (golden, golden_torch) = match golden {
        Some(g) => (
            vec![
                compare("accumulation", &accumulation, "golden accumulation", &g.accumulation, tol),
                compare("ddp", &ddp, "golden ddp", &g.ddp, tol),
            ],
            Some(match &g.meta.tool_version {
                Some(tool) => {
                    format!("{} (blessed by ddp-verify {tool}, libtorch {})", g.dir.display(), g.meta.torch_version)
                }
                None => format!("{} (PyTorch {})", g.dir.display(), g.meta.torch_version),
            }),
        ),
        None => (Vec::new(), None),
    };
    Outcome { config: cfg.clone(), accumulation, ddp, runs, golden, golden_torch, diagnosis }
}

fn save(dir: &PathBuf, o: &Outcome) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    o.accumulation.save(&dir.join(TRACE_FILES[0]))?;
    o.ddp.save(&dir.join(TRACE_FILES[1]))?;
    let json = crate::report::Format::Json.exporter().render(o);
    let path = dir.join(TRACE_FILES[2]);
    std::fs::write(&path, json).map_err(|e| Error::io(format!("writing {}", path.display()), e))
}
