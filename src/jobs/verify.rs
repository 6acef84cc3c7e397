//! The main job: both runs, judged against each other (and the golden), then reported.

use std::path::Path;
use std::time::Duration;

use crate::dist::{world, Collective};
use crate::error::{Error, Exit, Result};
use crate::evidence::{golden, Golden, Params, Trace, TraceWriter, SAVED_FILES};
use crate::judge::{Agreement, Judging, Outcome};
use crate::spec::Config;
use crate::train::{self, models, StepGrads};

/// `ddp-verify [flags]` in this process. Outside an MPI world (the core started directly,
/// or above `VALIDATE_FIRST_ABOVE` ranks): starts the W ranks and returns rank 0's exit.
/// Inside one: this process is a rank (see [`verify_in_world`]); rank 0 writes the reports.
pub fn command(cfg: &Config) -> Result<Exit> {
    if !world::inside_mpi_world() {
        let timeout = Duration::try_from_secs_f64(cfg.timeout_s).unwrap_or(Duration::MAX);
        return world::relaunch(cfg.train.shape.gpus, std::env::args_os().skip(1), Some(timeout));
    }
    let Some(outcome) = verify_in_world(cfg)? else {
        return Ok(Exit::Equivalent);
    };
    crate::profile::mark("outcome");
    crate::report::write_all(&outcome, &cfg.reports)?;
    crate::profile::mark("reported");
    Ok(outcome.exit())
}

/// Inside an MPI world (ours, started by `ddp-verify`, or a user's `mpirun`): every
/// process is a DDP rank; rank 0 also runs accumulation on a thread of its own and returns
/// the outcome, the others return None.
pub fn verify_in_world(cfg: &Config) -> Result<Option<Outcome>> {
    let rank = world::init_rank()?;
    crate::profile::mark("mpi initialised");
    let is_root = rank.comm.rank() == 0;
    world::fault_hooks(rank.comm.rank());
    // Rank 0 alone checks and reads the golden, and checks that the kernels repeat
    // themselves; it tells the others whether to go on, so a refusal there never leaves
    // them waiting in a collective.
    let checked = match is_root {
        true => super::preflight(cfg).and_then(|()| load_golden(cfg)).and_then(|g| Ok((g, repeats(cfg)?))),
        false => Ok((None, None)),
    };
    let mut go = [match &checked {
        Ok((_, None)) => GO,
        Ok((_, Some(_))) => NO_VERDICT,
        Err(_) => STOP,
    }];
    rank.comm.broadcast(&mut go, 0)?;
    let (golden, unrepeatable) = checked?;
    if let Some(why) = unrepeatable {
        return Ok(Some(Outcome::no_verdict(cfg, why)));
    }
    if go[0] != GO {
        return Err(Error::FollowerStopped);
    }
    // Past the go-ahead every rank is in the collectives: a failure must end them all.
    let result = go_ahead(cfg, &rank, golden);
    rank.fail_all(result)
}

/// What rank 0 tells the others after its checks: go on, stop (it refused the input), or
/// stop with no verdict (the kernels do not repeat themselves).
const GO: f32 = 1.0;
const STOP: f32 = 0.0;
const NO_VERDICT: f32 = 2.0;

/// This process's kernels, as `main` pinned them ([`crate::dist::kernels::apply`]).
pub(crate) fn platform(cfg: &Config) -> Result<&'static crate::spec::Platform> {
    crate::dist::kernels::apply(cfg.kernels, cfg.train.run.device)
}

/// Whether the kernels repeat themselves for this run (`train::repeat_check`).
pub(crate) fn repeats(cfg: &Config) -> Result<Option<train::Unrepeatable>> {
    let unrepeatable = train::repeat_check(&cfg.train, platform(cfg)?)?;
    crate::profile::mark("kernels repeat");
    Ok(unrepeatable)
}

/// The golden to check against, unless there is none or this run records it.
pub(crate) fn load_golden(cfg: &Config) -> Result<Option<Golden>> {
    match &cfg.golden {
        Some(dir) if !cfg.bless => {
            Ok(Some(Golden::load(dir, &cfg.train, &models::shapes(&cfg.train)?, platform(cfg)?)?))
        }
        _ => Ok(None),
    }
}

fn go_ahead(cfg: &Config, rank: &world::MpiRank, golden: Option<Golden>) -> Result<Option<Outcome>> {
    let is_root = rank.comm.rank() == 0;
    let comm = world::rank_collective(&cfg.train, &rank.comm)?;
    world::failure_hook(rank.comm.rank())?;
    crate::profile::mark("prepared");
    if cfg.train.run.lockstep {
        return judge_in_lockstep(cfg, comm.as_ref(), Judging::new(cfg, golden));
    }
    if !is_root {
        train::ddp_rank(&cfg.train, comm.as_ref())?;
        return Ok(None);
    }
    // Free-running, the runs share nothing until compared: DDP beside accumulation, then
    // the big batch.
    let (accumulation, ddp) = std::thread::scope(|scope| {
        let accumulation = scope.spawn(|| {
            world::pin_threads();
            let acc = train::accumulation(&cfg.train)?;
            let big = cfg.train.with_big_batch().then(|| train::big_batch(&cfg.train)).transpose()?;
            Ok::<_, Error>((acc, big))
        });
        let ddp = train::ddp_rank(&cfg.train, comm.as_ref());
        (accumulation.join().expect("the accumulation thread does not panic"), ddp)
    });
    let ((mut accumulation, big), mut ddp) = (accumulation?, ddp?);
    stamp(&cfg.train, &mut accumulation, &mut ddp);
    after(cfg, assemble(cfg, accumulation, ddp, big, golden), false).map(Some)
}

/// The header `--save-trace` files carry, so `compare` can say what each trace is.
pub(crate) fn stamp(t: &crate::spec::TrainConfig, accumulation: &mut Trace, ddp: &mut Trace) {
    use crate::evidence::{schema, RunKind, TraceHeader};
    for (trace, run, world) in [(accumulation, RunKind::Accumulation, 1), (ddp, RunKind::Ddp, t.shape.gpus)] {
        trace.header = TraceHeader {
            version: Some(schema::VERSION),
            run: Some(run),
            world_size: Some(world),
            acc_steps: Some(t.shape.acc_steps),
            steps_per_epoch: Some(crate::plan::sampler::steps_per_epoch(t)),
            dtype: Some(t.precision.dtype),
            written_by: Some(format!("ddp-verify {}", env!("CARGO_PKG_VERSION"))),
            torch_version: Some(crate::evidence::golden::LIBTORCH_VERSION.to_string()),
            ..TraceHeader::default()
        };
    }
}

/// Above this many bytes of gradients over all steps, lockstep compares each step as it
/// comes and keeps none (unless blessing; `--save-trace` streams them to disk).
const KEEP_STEPS_BYTES: f64 = 64.0 * 1024.0 * 1024.0;

/// Both runs in lockstep; every comparison streams step by step.
fn judge_in_lockstep(cfg: &Config, comm: &dyn Collective, mut judging: Judging) -> Result<Option<Outcome>> {
    let steps = crate::plan::optimizer_steps(&cfg.train) as f64;
    let mut keep = None;
    // --save-trace streams each step to disk as it comes.
    // Rank 0 alone writes: the others would open the same files.
    let mut writers = match cfg.save_trace.as_ref().filter(|_| comm.rank() == 0) {
        Some(dir) => {
            std::fs::create_dir_all(dir).map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
            Some([TraceWriter::create(&dir.join(SAVED_FILES[0]))?, TraceWriter::create(&dir.join(SAVED_FILES[1]))?])
        }
        None => None,
    };
    let (mut kept_acc, mut kept_ddp, mut kept_big) = (Vec::new(), Vec::new(), Vec::new());
    let mut sink = |s: usize, step: StepGrads| -> Result<()> {
        let StepGrads { accumulation: a, ddp: d, allowed, big } = step;
        judging.step(s, &a, &d, &allowed, big.as_ref().map(|(b, ab)| (b, ab)));
        if let Some([wa, wd]) = writers.as_mut() {
            wa.step(s, &a)?;
            wd.step(s, &d)?;
        }
        // Decided on the first step's real size: both runs' gradients over every step.
        let bytes = |p: &Params| p.iter().map(|(_, t)| t.nbytes()).sum::<usize>();
        if *keep.get_or_insert_with(|| cfg.bless || 2.0 * bytes(&a) as f64 * steps <= KEEP_STEPS_BYTES) {
            kept_acc.push(a);
            kept_big.extend(big.map(|(b, _)| b));
            kept_ddp.push(d);
        }
        Ok(())
    };
    let Some((mut acc, mut ddp, big)) = train::lockstep(&cfg.train, comm, &mut sink)? else {
        return Ok(None);
    };
    stamp(&cfg.train, &mut acc, &mut ddp);
    crate::profile::mark("runs finished");
    if let Some([wa, wd]) = writers {
        wa.finish(&acc)?;
        wd.finish(&ddp)?;
    }
    acc.steps = kept_acc.into_iter().filter(|p| !p.is_empty()).collect();
    ddp.steps = kept_ddp.into_iter().filter(|p| !p.is_empty()).collect();
    let keep_big = acc.steps.len() == kept_big.len();
    let big = big.map(|b| Trace { steps: if keep_big { kept_big } else { Vec::new() }, ..b });
    let outcome = judging.finish(acc, ddp, big);
    crate::profile::mark("diagnosed");
    after(cfg, outcome, true).map(Some)
}

/// Blesses and saves what a finished outcome asks for (`streamed`: the traces of
/// `--save-trace` are already written).
pub(crate) fn after(cfg: &Config, outcome: Outcome, streamed: bool) -> Result<Outcome> {
    if let (true, Some(dir)) = (cfg.bless, &cfg.golden) {
        // Only an equivalent pair of runs is worth recording as the reference.
        if outcome.agreement() != Agreement::Diverged {
            golden::bless(dir, &cfg.train, &outcome.accumulation, &outcome.ddp, platform(cfg)?)?;
        }
    }
    if let Some(dir) = &cfg.save_trace {
        save(dir, &outcome, streamed)?;
    }
    Ok(outcome)
}

/// Judges two finished runs (and the golden); pure, so reports can be tested on
/// committed traces.
pub fn assemble(cfg: &Config, accumulation: Trace, ddp: Trace, big: Option<Trace>, golden: Option<Golden>) -> Outcome {
    let mut judging = Judging::new(cfg, golden);
    judging.steps_of(&accumulation, &ddp, big.as_ref());
    judging.finish(accumulation, ddp, big)
}

fn save(dir: &Path, o: &Outcome, streamed: bool) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    if !streamed {
        o.accumulation.save(&dir.join(SAVED_FILES[0]))?;
        o.ddp.save(&dir.join(SAVED_FILES[1]))?;
    }
    let path = dir.join(SAVED_FILES[2]);
    std::fs::write(&path, crate::report::render(crate::spec::Format::Json, o))
        .map_err(|e| Error::io(format!("writing {}", path.display()), e))
}
