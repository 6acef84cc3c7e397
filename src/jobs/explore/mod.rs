//! `ddp-verify explore`: random configurations through both runs on ranks started once,
//! each failure shrunk by proptest to a minimal reproducing command, and planted bugs
//! tallied against the configurations they can change.

mod summary;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config as RunnerConfig, RngAlgorithm, TestRng, TestRunner};

use super::pool::RankPool;
use crate::dist::{world as launch, Collective as _};
use crate::error::{Error, Exit, Result};
use crate::judge::{diagnose, Comparer, Context, Diagnosis, Verdict};
use crate::plan::Effect;
use crate::spec::{
    Amp, AmpConfig, Bug, Dtype, ModelKind, OptimConfig, Optimizer, Schedule, ToleranceOverrides, TrainConfig,
};
use crate::train::accumulation;

pub struct ExploreOptions {
    pub cases: usize,
    pub max_gpus: usize,
    /// The models configurations are drawn for (linear, resnet-tiny).
    pub models: Vec<ModelKind>,
    pub seed: u64,
    /// One pass per entry; `None` is the honest run.
    pub bugs: Vec<Option<Bug>>,
    /// --max-ulps/--rtol/--atol, if given; else each case is held to its derived bounds.
    pub tolerance: ToleranceOverrides,
    /// Minimal failing configurations, replayed first and appended to (proptest's idea of
    /// persisted regressions, stored as the configs themselves).
    pub regressions: Option<PathBuf>,
    pub progress: bool,
    /// Print the report as JSON instead of text.
    pub json: bool,
    /// The CPU kernels every case computes with.
    pub kernels: crate::spec::KernelMode,
}

/// Random valid configurations of the given models (linear three times as often as a
/// ResNet or tiny-lm when several are asked for: it is 20 times faster).
pub fn strategy(max_gpus: usize, models: &[ModelKind]) -> BoxedStrategy<TrainConfig> {
    let mut arms: Vec<(u32, BoxedStrategy<TrainConfig>)> = Vec::new();
    if models.contains(&ModelKind::Linear) {
        arms.push((3, linear_strategy(max_gpus).boxed()));
    }
    if models.iter().any(|m| m.is_resnet()) {
        arms.push((1, resnet_strategy(max_gpus).boxed()));
    }
    if models.contains(&ModelKind::TinyLm) {
        arms.push((1, tiny_lm_strategy(max_gpus).boxed()));
    }
    let models = match arms.len() {
        0 => linear_strategy(max_gpus).boxed(),
        1 => arms.pop().expect("one arm").1,
        _ => proptest::strategy::Union::new_weighted(arms).boxed(),
    };
    // Narrow dtypes keep SGD: AdamW's state in bfloat16 or float16 is what AMP avoids
    // (float32 moments), and what this tool checks there is the reduction. So do free-running
    // deep nets, held to a fixed tolerance: AdamW turns a rounding difference in a noise
    // gradient into a whole step, which only the derived (lockstep) bound follows.
    let narrow = |c: &TrainConfig| c.dtype.is_narrow() || !c.bounds_hold();
    // tiny-lm drops out in one draw of three.
    let dropout = prop_oneof![2 => Just(0.0), 1 => 0.05f64..0.5];
    (models, optim_strategy(), dropout, amp_strategy())
        .prop_map(move |(c, optim, dropout, amp)| {
            let optim = if narrow(&c) { OptimConfig { optimizer: Optimizer::Sgd, ..optim } } else { optim };
            let dropout = if c.model.token_loss() { dropout } else { 0.0 };
            // Autocast over float32 weights only; an overflow planted in a step that runs.
            let amp = match c.dtype {
                Dtype::Float32 => {
                    let steps = crate::plan::optimizer_steps(&c);
                    AmpConfig { overflow_step: amp.overflow_step.filter(|&s| s < steps), ..amp }
                }
                _ => AmpConfig::default(),
            };
            TrainConfig { optim, dropout, amp, ..c }
        })
        .boxed()
}

/// Mixed precision in one draw of three: bfloat16 autocast, or float16 with a GradScaler
/// from 2^4-2^16 growing every 1-6 steps, and one micro-batch made to overflow in one of
/// those draws of three.
pub fn amp_strategy() -> impl Strategy<Value = AmpConfig> {
    (0usize..6, 4i32..=16, 1u32..=6, prop_oneof![2 => Just(None), 1 => (0usize..4).prop_map(Some)]).prop_map(
        |(draw, scale, growth_interval, overflow_step)| match draw {
            0 => AmpConfig { amp: Some(Amp::Bfloat16), ..AmpConfig::default() },
            1 => AmpConfig { amp: Some(Amp::Float16), init_scale: 2f64.powi(scale), growth_interval, overflow_step },
            _ => AmpConfig::default(),
        },
    )
}

/// The optimizer step: SGD or AdamW (half each), clipping in one draw of three at a norm
/// that may or may not engage, and a constant, warmup or cosine schedule.
pub fn optim_strategy() -> impl Strategy<Value = OptimConfig> {
    (
        any::<bool>(),
        prop_oneof![2 => Just(None), 1 => (0.01f64..5.0).prop_map(Some)],
        prop_oneof![
            Just(Schedule::Constant),
            (1usize..6).prop_map(Schedule::Warmup),
            (1usize..6).prop_map(Schedule::Cosine)
        ],
        prop_oneof![Just(1e-8), Just(1e-6)],
    )
        .prop_map(|(adamw, clip_grad_norm, lr_schedule, eps)| OptimConfig {
            optimizer: if adamw { Optimizer::AdamW } else { Optimizer::Sgd },
            clip_grad_norm,
            lr_schedule,
            eps,
            ..OptimConfig::default()
        })
}

/// Plants `bug` in a drawn configuration, with what it misuses: clipping that always
/// engages (1e-4; float16 1e-2) for clip-per-micro-batch, a warmup for schedule-per-micro-batch, AdamW
/// for adamw-no-loss-scale, dropout for dropout-same-seed. The other bugs are drawn without clipping: clipping that
/// engages at every step renormalises a wrongly scaled gradient, which hides a scaling bug
/// in a way no plan can foresee (it depends on the gradients' norms).
pub fn plant(cfg: &mut TrainConfig, bug: Option<Bug>) {
    cfg.inject = bug;
    // Bugs that only the big batch shows (both runs make them; dropout-same-seed at W = 1)
    // need it, and --amp turns it off.
    if bug.is_some_and(|b| b.in_both_runs() || b == Bug::DropoutSameSeed) {
        cfg.amp = AmpConfig::default();
    }
    let dtype = cfg.dtype;
    let o = &mut cfg.optim;
    match bug {
        None => {}
        // float16's clipped gradients would be subnormal at 1e-4, rounded to a few bits.
        Some(Bug::ClipPerMicroBatch) => o.clip_grad_norm = Some(if dtype == Dtype::Float16 { 1e-2 } else { 1e-4 }),
        Some(b) => {
            o.clip_grad_norm = None;
            match b {
                Bug::SchedulePerMicroBatch if o.lr_schedule == Schedule::Constant => {
                    o.lr_schedule = Schedule::Warmup(4)
                }
                Bug::AdamwNoLossScale => o.optimizer = Optimizer::AdamW,
                Bug::DropoutSameSeed if cfg.dropout == 0.0 => cfg.dropout = 0.1,
                // The loss scaler's bugs need one; a growth interval of 1 makes the
                // per-micro-batch updates grow the scale inside a window.
                Bug::UnscalePerMicroBatch | Bug::ScalerUpdatePerMicroBatch => {
                    cfg.dtype = Dtype::Float32;
                    cfg.amp.amp = Some(Amp::Float16);
                    if b == Bug::ScalerUpdatePerMicroBatch {
                        cfg.amp.growth_interval = 1;
                    }
                }
                _ => {}
            }
        }
    }
}

/// tiny-lm: W 1-4, K a multiple of W up to 12, short sequences of any lengths, float32 or
/// float64, in lockstep (its default), a short window at an epoch's end stepping.
pub fn tiny_lm_strategy(max_gpus: usize) -> impl Strategy<Value = TrainConfig> {
    let w_max = max_gpus.clamp(1, 4);
    (
        (1..=w_max, 1usize..=3, 1usize..=4, 1usize..=32, 1usize..=2, 2usize..=12, 0usize..=10),
        (any::<bool>(), any::<bool>(), 0u64..1000, 0.001f64..0.1, 0.0f64..0.95, prop_oneof![Just(0.0), 1e-4f64..1e-2]),
        (4usize..=64, any::<bool>(), 1usize..=4),
    )
        .prop_map(
            |(
                (gpus, local, batch_size, data_size, epochs, seq_len, shorter),
                (shuffle, drop_last, seed, lr, momentum, weight_decay),
                (vocab, double, steps),
            )| TrainConfig {
                model: ModelKind::TinyLm,
                data_size: data_size.max(gpus),
                features: 8,
                seed,
                epochs,
                batch_size,
                acc_steps: local * gpus,
                gpus,
                lr,
                momentum,
                shuffle,
                drop_last,
                weight_decay,
                vocab,
                seq_len,
                min_len: seq_len.saturating_sub(shorter).max(2),
                partial_window: crate::spec::PartialWindow::Step,
                max_steps: Some(steps),
                dtype: if double { Dtype::Float64 } else { Dtype::Float32 },
                lockstep: true,
                ..TrainConfig::article()
            },
        )
        .prop_filter("a valid config", |c| crate::plan::checks::check_train(c).is_ok())
}

/// resnet-tiny: W 1-8, K a multiple of W up to 16, micro-batches BatchNorm accepts, every
/// dtype in lockstep, and float64 free-running for at most 2 steps (its chaos grows 10^3 to
/// 10^6-fold per step, so the fixed float64 bound holds for two).
pub fn resnet_strategy(max_gpus: usize) -> impl Strategy<Value = TrainConfig> {
    let w_max = max_gpus.clamp(1, 8);
    (
        (1..=w_max, 1usize..=16, 2usize..=4, 1usize..=64, prop_oneof![Just(8usize), Just(16)], 1usize..=2),
        (any::<bool>(), any::<bool>(), 0u64..1000, 0.001f64..0.05, 0.0f64..0.95, prop_oneof![Just(0.0), 1e-4f64..1e-2]),
        (0usize..5, 1usize..=4),
    )
        .prop_map(
            |(
                (gpus, local, batch_size, data_size, image_size, epochs),
                (shuffle, drop_last, seed, lr, momentum, weight_decay),
                (mode, steps),
            )| {
                // Mode 4 is float64 free-running; 0-3 are the dtypes in lockstep.
                let free = mode == 4;
                TrainConfig {
                    model: ModelKind::ResnetTiny,
                    data_size: data_size.max(gpus * batch_size),
                    features: 8,
                    seed,
                    epochs,
                    batch_size,
                    acc_steps: (local.min(16 / gpus).max(1)) * gpus,
                    gpus,
                    lr,
                    momentum,
                    shuffle,
                    drop_last,
                    image_size,
                    weight_decay,
                    max_steps: Some(if free { steps.min(2) } else { steps }),
                    dtype: if free { Dtype::Float64 } else { Dtype::ALL[mode] },
                    lockstep: !free,
                    ..TrainConfig::article()
                }
            },
        )
        .prop_filter("a valid config whose micro-batches BatchNorm accepts, planted bugs included", |c| {
            crate::plan::checks::check_train(c).is_ok()
                && std::iter::once(None)
                    .chain(Bug::ALL.map(Some))
                    .all(|b| crate::plan::bugs::micro_batches_hold(c, b, 2))
        })
}

/// The linear model; K is drawn as a multiple of W so every draw is usable.
pub fn linear_strategy(max_gpus: usize) -> impl Strategy<Value = TrainConfig> {
    (
        1..=max_gpus.max(1),
        1usize..=4,
        1usize..=48,
        1usize..=16,
        1usize..=8,
        1usize..=3,
        any::<bool>(),
        any::<bool>(),
        0u64..1000,
        0.001f64..0.1,
        0.0f64..0.95,
        any::<bool>(),
    )
        .prop_map(
            |(gpus, local, data_size, features, batch_size, epochs, shuffle, drop_last, seed, lr, momentum, step)| {
                TrainConfig {
                    partial_window: if step {
                        crate::spec::PartialWindow::Step
                    } else {
                        crate::spec::PartialWindow::Carry
                    },
                    data_size,
                    features,
                    seed,
                    epochs,
                    batch_size,
                    acc_steps: local * gpus,
                    gpus,
                    lr,
                    momentum,
                    shuffle,
                    drop_last,
                    ..TrainConfig::article()
                }
            },
        )
        .prop_filter("a valid config with at least one optimizer step", |c| crate::plan::checks::check_train(c).is_ok())
}

/// What one bug (or the honest run) did over all cases.
#[derive(Debug, Default, serde::Serialize)]
pub struct Tally {
    pub bug: Option<Bug>,
    pub cases: usize,
    pub replayed: usize,
    /// Regressions that need more ranks than --max-gpus started.
    pub skipped_regressions: usize,
    pub not_equivalent: usize,
    /// Honest draws whose training blew up (NaN or Inf in both runs): nothing can be proven
    /// from them, so they count neither way.
    pub blew_up: usize,
    /// Draws whose kernels gave other bits for the same micro-batch (`train::repeat_check`):
    /// no verdict, never a pass nor a false alarm.
    pub no_verdict: usize,
    /// Draws under a float16 loss scaler whose every step was skipped by both runs or left
    /// unjudged by float16's range: nothing judged, so they count neither way.
    pub unjudged: usize,
    /// Cases of a ResNet among `cases`.
    pub resnet_cases: usize,
    /// Honest runs: the largest fraction of its allowance any case used (under 1 passes).
    pub max_used: f64,
    /// Planted bugs: the smallest factor by which a caught case exceeded its allowance.
    pub min_margin: Option<f64>,
    pub reasons: BTreeMap<&'static str, usize>,
    pub changes_math: usize,
    /// Configurations the bug only reorders (the same sums, other rounding), and on how
    /// many of them the gate fired anyway.
    pub reordered: usize,
    pub reordered_fired: usize,
    pub caught: usize,
    pub missed: usize,
    pub false_alarms: usize,
    /// The shrunk case worth showing: a failure, a miss or false alarm, or else the
    /// smallest config the bug was caught on.
    pub example: Option<Example>,
}

#[derive(Debug, serde::Serialize)]
pub struct Example {
    pub what: &'static str,
    pub config: TrainConfig,
    pub diagnosis: Option<Diagnosis>,
}

#[derive(Debug, Default, serde::Serialize)]
pub struct Timing {
    pub total: f64,
    pub start: Option<f64>,
    pub ddp: f64,
    pub comm: f64,
    pub accumulation: f64,
    pub compare: f64,
    pub evaluations: usize,
}

/// What explore found; `--json` prints it as it is.
#[derive(serde::Serialize)]
pub struct ExploreReport {
    pub seed: u64,
    pub cases: usize,
    pub max_gpus: usize,
    /// The models configurations are drawn for (linear, resnet-tiny).
    pub models: Vec<ModelKind>,
    pub tallies: Vec<Tally>,
    pub timing: Timing,
}

struct Case {
    verdict: Verdict,
    /// The worst difference over what it was allowed.
    used: f64,
    diagnosis: Option<Diagnosis>,
    /// No step was judged: the loss scalers skipped every one, or float16's range parted
    /// the runs (`judge::NotJudged`).
    unjudged: bool,
    /// The kernels did not repeat themselves: nothing was run.
    no_verdict: bool,
}

struct Runner<'a> {
    pool: &'a RankPool,
    kernels: crate::spec::KernelMode,
    tol: ToleranceOverrides,
    timing: Timing,
}

impl Runner<'_> {
    fn evaluate(&mut self, cfg: &TrainConfig) -> Result<Case> {
        let t0 = Instant::now();
        let platform = crate::dist::kernels::apply(self.kernels, cfg.device)?;
        if crate::train::repeat_check(cfg, platform)?.is_some() {
            let (verdict, used, diagnosis, unjudged) = (Verdict::Exact, 0.0, None, false);
            return Ok(Case { verdict, used, diagnosis, unjudged, no_verdict: true });
        }
        let (acc, ddp) = self.pool.lead(cfg)?;
        let t1 = Instant::now();
        let (acc, big) = match acc {
            Some(acc) => acc,
            None => (accumulation(cfg)?, cfg.with_big_batch().then(|| crate::train::big_batch(cfg)).transpose()?),
        };
        let t2 = Instant::now();
        let tol = self.tol.tolerance(cfg.dtype, cfg.lockstep);
        let derive = self.tol.derive(cfg);
        let c = Comparer::new("accumulation", "ddp", &tol, None).derived(derive).finish(&acc, &ddp, false);
        let cx = Context::of_run(cfg);
        let mut diagnosis = diagnose(&acc, &ddp, &c, &cx);
        let (mut verdict, mut used) = (c.verdict, c.worst_fraction);
        let unjudged = c.verdict != Verdict::Diverged && c.steps.iter().all(|g| g.not_judged.is_some());
        if let Some(big) = big {
            // The same judgement a verification makes (`Trace::for_big_batch`).
            let acc = acc.for_big_batch();
            let b = Comparer::new("accumulation", "big batch", &tol, None).derived(derive).finish(&acc, &big, true);
            let runs_agree = c.verdict != Verdict::Diverged;
            if diagnosis.is_none() {
                diagnosis = crate::judge::diagnose_big_batch(&acc, &big, &b, &cx, runs_agree);
            }
            (verdict, used) = (verdict.max(b.verdict), used.max(b.worst_fraction));
        }
        let t = &mut self.timing;
        t.ddp += (t1 - t0).as_secs_f64();
        t.accumulation += (t2 - t1).as_secs_f64();
        t.compare += t2.elapsed().as_secs_f64();
        t.evaluations += 1;
        Ok(Case { verdict, used, diagnosis, unjudged, no_verdict: false })
    }
}

/// How a case came out relative to what it should have.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Finding {
    Fine,
    /// Honest run not equivalent: a real finding.
    Failure,
    /// The bug changed the math and the gate fired.
    Caught,
    /// The bug changed the math and the gate stayed quiet.
    Missed,
    /// The bug cannot change the math yet the gate fired.
    FalseAlarm,
    /// The bug reorders the same sums: rounding alone, counted neither way.
    Reordered,
    /// Nothing was judged (every step skipped or parted by float16's range): neither way.
    Unjudged,
    /// An honest draw whose training blew up: a bad draw, not a verdict on the gate.
    BlewUp,
    /// The kernels did not repeat themselves: no verdict either way.
    NoVerdict,
}

fn classify(bug: Option<Bug>, cfg: &TrainConfig, case: &Case) -> Finding {
    let diverged = case.verdict == Verdict::Diverged;
    let blew_up = case.diagnosis.as_ref().is_some_and(|d| d.reason == crate::judge::Reason::NonFinite);
    if case.no_verdict {
        return Finding::NoVerdict;
    }
    if case.unjudged && case.verdict != Verdict::Diverged {
        return Finding::Unjudged;
    }
    match bug {
        None if diverged && blew_up => Finding::BlewUp,
        None if diverged => Finding::Failure,
        None => Finding::Fine,
        Some(b) => match (b.effect(cfg), diverged) {
            (Effect::Math, true) => Finding::Caught,
            (Effect::Math, false) => Finding::Missed,
            (Effect::None, true) => Finding::FalseAlarm,
            (Effect::None, false) => Finding::Fine,
            (Effect::Order, _) => Finding::Reordered,
        },
    }
}

/// `ddp-verify explore`: outside an MPI world, starts `max_gpus` ranks once by running this
/// same command again under mpirun; inside one, rank 0 explores and prints while the other
/// ranks serve its jobs. Returns the exit code.
pub fn command(opts: &ExploreOptions) -> Result<Exit> {
    if !launch::inside_mpi_world() {
        return launch::relaunch(opts.max_gpus, std::env::args_os().skip(1), None);
    }
    let rank = launch::init_rank()?;
    launch::fault_hooks(rank.comm.rank());
    let pool = RankPool::new(rank.world());
    if opts.max_gpus > pool.size() {
        return Err(Error::bad_flag(
            "--max-gpus",
            format!("{} ranks are needed but mpirun started {}", opts.max_gpus, pool.size()),
            format!("pass --max-gpus {} or start mpirun -np {}", pool.size(), opts.max_gpus),
        ));
    }
    if !pool.is_leader() {
        // A rank that fails stops every rank at once, instead of leaving rank 0 waiting.
        rank.fail_all(pool.follow())?;
        return Ok(Exit::Equivalent);
    }
    let report = rank.fail_all(explore(opts, &pool))?;
    pool.stop();
    if opts.json {
        println!("{}", serde_json::to_string_pretty(&report).expect("the report serialises"));
    } else {
        print!("{}", report.to_text());
    }
    Ok(match (report.passed(), report.tallies.iter().any(|t| t.no_verdict > 0)) {
        (false, _) => Exit::NotEquivalent,
        (true, true) => Exit::NoVerdict,
        (true, false) => Exit::Equivalent,
    })
}

/// Rank 0's side of explore; the other ranks run `pool.follow()`.
pub fn explore(opts: &ExploreOptions, pool: &RankPool) -> Result<ExploreReport> {
    let started = Instant::now();
    let mut runner = Runner { pool, kernels: opts.kernels, tol: opts.tolerance, timing: Timing::default() };
    let mut tallies = Vec::new();
    for (pass, &bug) in opts.bugs.iter().enumerate() {
        // Each bug on the drawn models that can carry it; none, no pass.
        let models: Vec<ModelKind> =
            opts.models.iter().copied().filter(|&m| bug.is_none_or(|b| b.applies_to(m))).collect();
        if models.is_empty() {
            continue;
        }
        let strat = strategy(opts.max_gpus, &models);
        tallies.push(explore_one(opts, &mut runner, &strat, bug, pass)?);
    }
    let mut timing = runner.timing;
    timing.total = started.elapsed().as_secs_f64();
    timing.start = launch::seconds_since_launch().map(|s| (s - timing.total).max(0.0));
    timing.comm = pool.comm_seconds();
    if opts.progress {
        eprint!("\r{:60}\r", "");
    }
    Ok(ExploreReport {
        seed: opts.seed,
        cases: opts.cases,
        max_gpus: opts.max_gpus,
        models: opts.models.clone(),
        tallies,
        timing,
    })
}

fn explore_one<S: Strategy<Value = TrainConfig>>(
    opts: &ExploreOptions,
    runner: &mut Runner,
    strat: &S,
    bug: Option<Bug>,
    pass: usize,
) -> Result<Tally> {
    let mut tally = Tally { bug, ..Tally::default() };
    let record = |tally: &mut Tally, cfg: &TrainConfig, case: &Case| {
        let outcome = classify(bug, cfg, case);
        tally.cases += 1;
        tally.resnet_cases += usize::from(cfg.model.is_resnet());
        if outcome == Finding::BlewUp {
            tally.blew_up += 1;
            return outcome;
        }
        if outcome == Finding::NoVerdict {
            tally.no_verdict += 1;
            return outcome;
        }
        if outcome == Finding::Unjudged {
            tally.unjudged += 1;
            return outcome;
        }
        if bug.is_none() {
            tally.max_used = tally.max_used.max(case.used);
        }
        if case.verdict == Verdict::Diverged {
            tally.not_equivalent += 1;
            let reason = case.diagnosis.as_ref().map_or("unexplained", |d| d.reason.name());
            *tally.reasons.entry(reason).or_default() += 1;
        }
        if let Some(b) = bug {
            tally.changes_math += usize::from(b.changes_math(cfg));
        }
        match outcome {
            Finding::Caught => {
                tally.caught += 1;
                tally.min_margin = Some(tally.min_margin.map_or(case.used, |m| m.min(case.used)));
            }
            Finding::Missed => tally.missed += 1,
            Finding::FalseAlarm => tally.false_alarms += 1,
            Finding::Reordered => {
                tally.reordered += 1;
                tally.reordered_fired += usize::from(case.verdict == Verdict::Diverged);
            }
            _ => {}
        }
        outcome
    };

    if bug.is_none() {
        let (fit, too_big): (Vec<_>, Vec<_>) =
            read_regressions(opts.regressions.as_ref())?.into_iter().partition(|c| c.gpus <= opts.max_gpus);
        tally.skipped_regressions = too_big.len();
        for cfg in fit {
            let case = runner.evaluate(&cfg)?;
            tally.replayed += 1;
            if record(&mut tally, &cfg, &case) == Finding::Failure && tally.example.is_none() {
                tally.example = Some(Example { what: "replayed failure", config: cfg, diagnosis: case.diagnosis });
            }
        }
    }

    let mut rng_seed = [0u8; 32];
    rng_seed[..8].copy_from_slice(&opts.seed.to_le_bytes());
    let mut test_runner =
        TestRunner::new_with_rng(RunnerConfig::default(), TestRng::from_seed(RngAlgorithm::ChaCha, &rng_seed));
    // The tree to shrink and what it showed; a problem outranks a plain catch.
    let mut keep: Option<(S::Tree, Finding)> = None;
    for i in 0..opts.cases {
        let tree = strat.new_tree(&mut test_runner).map_err(|e| {
            Error::bad_flag("--max-gpus", format!("no valid configuration could be drawn ({e})"), "raise --max-gpus")
        })?;
        let mut cfg = tree.current();
        plant(&mut cfg, bug);
        let case = runner.evaluate(&cfg)?;
        let outcome = record(&mut tally, &cfg, &case);
        let rank = |o: Finding| match o {
            Finding::Fine | Finding::BlewUp | Finding::Unjudged | Finding::Reordered | Finding::NoVerdict => 0,
            Finding::Caught => 1,
            _ => 2,
        };
        if rank(outcome) > keep.as_ref().map_or(0, |(_, o)| rank(*o)) {
            keep = Some((tree, outcome));
        }
        if opts.progress {
            progress(pass, bug, i + 1, opts.cases, tally.not_equivalent);
        }
    }
    if let Some((mut tree, outcome)) = keep {
        if tally.example.is_none() {
            let config = shrink(&mut tree, |c| {
                let mut c = c.clone();
                plant(&mut c, bug);
                Ok(classify(bug, &c, &runner.evaluate(&c)?) == outcome)
            })?;
            let mut config = config;
            plant(&mut config, bug);
            let diagnosis = runner.evaluate(&config)?.diagnosis;
            if outcome == Finding::Failure {
                append_regression(opts.regressions.as_ref(), &config)?;
            }
            let what = match outcome {
                Finding::Failure => "not equivalent",
                Finding::Caught => "smallest config caught",
                Finding::Missed => "MISSED",
                _ => "FALSE ALARM",
            };
            tally.example = Some(Example { what, config, diagnosis });
        }
    }
    Ok(tally)
}

/// A one-line bar on stderr, redrawn in place (only when the launcher saw a terminal).
fn progress(pass: usize, bug: Option<Bug>, done: usize, total: usize, failed: usize) {
    const WIDTH: usize = 30;
    let filled = WIDTH * done / total.max(1);
    let label = bug.map_or("honest runs", Bug::name);
    eprint!(
        "\r[{}{}] {done}/{total} pass {} ({label}), {failed} not equivalent   ",
        "#".repeat(filled),
        ".".repeat(WIDTH - filled),
        pass + 1
    );
    let _ = std::io::stderr().flush();
}

/// proptest's shrink loop: simplify while the property still shows, else complicate.
fn shrink<T: ValueTree<Value = TrainConfig>>(
    tree: &mut T,
    mut still_shows: impl FnMut(&TrainConfig) -> Result<bool>,
) -> Result<TrainConfig> {
    let mut best = tree.current();
    if !tree.simplify() {
        return Ok(best);
    }
    for _ in 0..512 {
        let c = tree.current();
        let more = if still_shows(&c)? {
            best = c;
            tree.simplify()
        } else {
            tree.complicate()
        };
        if !more {
            break;
        }
    }
    Ok(best)
}

/// The regressions file's configurations; a line that is not one is refused (exit 2), never
/// skipped in silence. Configurations today's rules refuse are left out.
pub fn read_regressions(path: Option<&PathBuf>) -> Result<Vec<TrainConfig>> {
    let Some(path) = path.filter(|p| p.exists()) else { return Ok(Vec::new()) };
    let fix = "fix or delete the file (explore writes one configuration as JSON per line)";
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::bad_file(path, format!("--regressions cannot be read ({e})"), fix))?;
    let mut configs = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let cfg: TrainConfig = serde_json::from_str(line).map_err(|e| {
            Error::bad_file(path, format!("--regressions line {} is not a configuration ({e})", i + 1), fix)
        })?;
        if crate::plan::checks::check_train(&cfg).is_ok() {
            configs.push(cfg);
        }
    }
    Ok(configs)
}

/// Appends a minimal failing configuration; a failure to write it is an error, not a
/// finding lost in silence.
fn append_regression(path: Option<&PathBuf>, cfg: &TrainConfig) -> Result<()> {
    let Some(path) = path else { return Ok(()) };
    let io = |e| Error::io(format!("appending to {}", path.display()), e);
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let fresh = !path.exists();
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(io)?;
    let mut text = String::new();
    if fresh {
        text.push_str("# Minimal configurations ddp-verify explore found not equivalent; replayed first.\n");
    }
    text.push_str(&serde_json::to_string(cfg).expect("config serialises"));
    text.push('\n');
    f.write_all(text.as_bytes()).map_err(io)
}
