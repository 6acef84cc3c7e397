//! The one judgement, for our own runs and users' traces alike: accumulation against DDP
//! (and against the big batch, where there is one), each run against its golden, the likely
//! cause of a divergence, the caution beside an equivalence, and what each leg's
//! synchronisation cost, assembled into the [`Outcome`]. What differs between the two paths
//! is only how the legs are judged ([`Terms`]).

use std::path::PathBuf;

use super::control::{self, Proof};
use super::diagnose::{most_apart, restated, ControlPath, Evidence, Pair, Tier};
use super::{
    adamw_finals, caution, cautioned, costs, diagnose, diagnose_big_batch, facts_apart, finals_judged,
    hidden_by_clipping, needless_sync, Agreement, BigBatch, Comparer, Comparison, Context, Diagnosis, Numbers, Outcome,
    Parting, Reason, SampledPair, Subject, TracePair,
};
use crate::evidence::{BigLeg, Golden, Legs, Params, Trace, Unrepeatable};
use crate::spec::{CompareOptions, Config, Dtype, Tolerance};

/// How the legs are judged.
pub enum Terms<'o> {
    /// Our own runs, by their configuration: each step already fed to the comparers
    /// ([`Judging`]: streamed in lockstep, or from the finished runs), the golden beside them.
    Run(Box<Judging>),
    /// Traces recorded elsewhere, by what they say of themselves and how `compare` was asked
    /// to judge them.
    Traces(&'o CompareOptions),
}

/// The comparers and what is known of the runs, ready to finish.
struct Bench {
    subject: Subject,
    runs: Comparer,
    /// Whether the runs' buffers count toward the verdict.
    buffers: bool,
    /// Accumulation vs the big batch, and whether its buffers count.
    big: Option<(Comparer, bool)>,
    golden: Option<(Golden, [Comparer; 2], Option<Comparer>)>,
    context: Context,
    /// Each step was fed to the comparers as it came: the legs keep their steps for the
    /// diagnosis and the reports, and only their ends are left to compare.
    streamed: bool,
    /// The final weights were held to the fixed tolerance under an optimizer that may
    /// amplify rounding past it (no bound carried): apart there, only a control can tell.
    finals_unbounded: bool,
}

/// Judges `legs` by `terms`: every comparison finished; then a divergence's likely cause, or
/// beside an equivalence its caution (a factor clipping hides, needless synchronisation);
/// and each leg's cost of synchronising, where recorded.
pub fn judge(legs: Legs, terms: Terms) -> Outcome {
    let Legs { mut accumulation, ddp, mut big, sampled, control, precision, precision_ddp } = legs;
    let precision_wanted = match &terms {
        Terms::Traces(opts) if precision.is_none() && !opts.tolerance.given() => {
            super::precision::wanted(&accumulation, &ddp)
        }
        _ => None,
    };
    let controls = (precision.as_ref(), precision_ddp.as_ref());
    let bench = match terms {
        Terms::Run(judging) => judging.bench(),
        Terms::Traces(opts) => of_traces(&mut accumulation, &ddp, big.as_mut(), controls, opts, sampled),
    };
    let Bench { subject, runs, buffers, big: big_cmp, golden, context, streamed, finals_unbounded } = bench;
    let ends = |t: &Trace| streamed.then(|| t.without_steps());
    let (acc_end, ddp_end) = (ends(&accumulation), ends(&ddp));
    let (acc_end, ddp_end) = (acc_end.as_ref().unwrap_or(&accumulation), ddp_end.as_ref().unwrap_or(&ddp));
    let mut runs = runs.finish(acc_end, ddp_end, buffers);
    let (golden, golden_torch) = match golden {
        Some(g) => goldens(g, acc_end, ddp_end, big.as_ref().map(|b| &b.trace)),
        None => (Vec::new(), None),
    };
    let big_batch = match (big_cmp, big) {
        (Some((cmp, counted)), Some(BigLeg { accumulation: acc, trace })) => {
            let (acc_end, big_end) = (ends(&acc), ends(&trace));
            let comparison = cmp.finish(acc_end.as_ref().unwrap_or(&acc), big_end.as_ref().unwrap_or(&trace), counted);
            let runs_agree = runs.verdict != Agreement::Diverged;
            let diagnosis = diagnose_big_batch(&acc, &trace, &comparison, &context, runs_agree);
            let shorts = acc.header.short_batches.unwrap_or(0);
            let decisive = !(shorts > 0 && runs_agree && comparison.verdict == Agreement::Diverged);
            Some(BigBatch { trace, comparison, diagnosis, decisive, shorts })
        }
        _ => None,
    };
    let mut diagnosis = diagnose(&accumulation, &ddp, &runs, &context);
    // What rounding explains (a tolerance tighter than rounding), or nothing, is no cause
    // until a control says the runs left rounding's path; a shape or a stage is kept.
    let guessed = |d: &Option<Diagnosis>| {
        d.as_ref().is_none_or(|d| d.reason == Reason::Unexplained || d.tier == Some(Tier::Rounding))
    };
    // A factor clipping hid, shown by the stage facts, outranks a guess.
    if guessed(&diagnosis) {
        if let Some((ratio, d)) = hidden_by_clipping(&accumulation, &ddp, &runs, &context) {
            runs.verdict = Agreement::Diverged;
            runs.hidden_factor = Some(ratio);
            diagnosis = Some(d);
        }
    }
    // A recorded fact apart decides, however small the numbers' difference, and outranks a
    // guess, or another cause shown at a later step, where they diverged (a control could
    // otherwise call it amplified rounding).
    let later = |d: &Option<Diagnosis>, f: &Diagnosis| {
        d.as_ref().is_some_and(|d| d.reason != f.reason && d.step.zip(f.step).is_some_and(|(x, y)| x > y))
    };
    if let Some((d, measured)) = facts_apart(&accumulation, &ddp, &runs, &context) {
        runs.fact = measured;
        if runs.verdict != Agreement::Diverged || guessed(&diagnosis) || later(&diagnosis, &d) {
            runs.by_fact = runs.verdict != Agreement::Diverged;
            runs.verdict = Agreement::Diverged;
            diagnosis = Some(d);
        }
    }
    // Where a precision control measured the rounding of every step and of the final
    // weights, no nudged control is asked for: its nudge, sized by a narrow dtype's step-0
    // difference, would prove any later parting rounding.
    let measured = matches!(&subject, Subject::Traces(p) if matches!(p.precision, Some(Ok(_))));
    // Precision apart is decided: no control measures legs that compute otherwise.
    let precision_wanted =
        precision_wanted.filter(|_| diagnosis.as_ref().is_none_or(|d| d.reason != Reason::PrecisionApart));
    let wanted = match context.ours() || measured {
        true => None,
        false => control::wanted(diagnosis.as_ref(), &runs, &accumulation, &ddp, finals_unbounded, context.eps),
    };
    let (diagnosis, amplified, control_wanted) = match (wanted, control.as_ref()) {
        (None, _) => (diagnosis, None, None),
        (Some(scale), None) if guessed(&diagnosis) => {
            (unproven(&accumulation, &ddp, &runs, &context, ControlPath::None), None, Some(scale))
        }
        (Some(scale), None) => (diagnosis, None, Some(scale)),
        (Some(_), Some(ctrl)) => match control::prove(&accumulation, &ddp, ctrl, &runs) {
            Proof::Rounding(numbers) => {
                runs.verdict = Agreement::WithinTolerance;
                let p = Parting::new(None, None, None, numbers);
                (None, Some(cautioned(&p, &runs.left, &runs.right)), None)
            }
            Proof::Left { step, path } => {
                let d = match (guessed(&diagnosis), step) {
                    // A cause the pipeline named, now proven more than rounding.
                    (false, Some(_)) => diagnosis,
                    _ => unproven(&accumulation, &ddp, &runs, &context, path),
                };
                (d, None, None)
            }
        },
    };
    // Narrow legs whose rounding no control measured, apart beyond the wide tolerance: not
    // proven to be rounding (the job that can run the control does, then judges again).
    let unmeasured = match &subject {
        Subject::Traces(pair) => pair.precision.as_ref().and_then(|p| p.as_ref().err()),
        Subject::Run(_) => None,
    };
    let diagnosis = match unmeasured {
        Some(why) if runs.verdict == Agreement::Diverged && guessed(&diagnosis) => {
            unproven(&accumulation, &ddp, &runs, &context, ControlPath::Precision(why.clone()))
        }
        _ => diagnosis,
    };
    let costs = costs([&runs.left, &runs.right], &accumulation, &ddp);
    let caution = match diagnosis {
        Some(_) => None,
        None if amplified.is_some() => amplified,
        None => caution(&accumulation, &ddp, &runs, &context)
            .or_else(|| big_batch.as_ref().and_then(short_batches))
            .or_else(|| needless_sync(&costs).map(|p| cautioned(&p, &runs.left, &runs.right))),
    };
    Outcome {
        subject,
        accumulation,
        ddp,
        runs,
        big_batch,
        golden,
        golden_torch,
        diagnosis,
        no_verdict: None,
        caution,
        notes: Vec::new(),
        costs,
        control_wanted,
        precision_wanted,
    }
}

/// The cause where no recorded fact differs and rounding was not proven: the pipeline's
/// unexplained difference, with what the control said (or that none ran).
fn unproven(a: &Trace, b: &Trace, runs: &Comparison, cx: &Context, path: ControlPath) -> Option<Diagnosis> {
    let ev = Evidence::new(a, b, runs, cx, Pair::Runs);
    let (first, tensors) = most_apart(runs);
    let finals_exact = super::diagnose::recording_in_doubt(runs);
    let p = Parting::new(first, None, None, Numbers::Unexplained { tensors, control: Some(path), finals_exact });
    Some(restated(&p, &ev, Tier::Shape))
}

/// A big batch that parts from accumulation where DDP does not, in a run whose one process
/// averaged short micro-batches alone (N off a multiple of W·B): each short batch's samples
/// weigh more than in one big batch, by construction of the per-micro-batch mean. Said
/// beside the verdict, which it does not decide: DDP and accumulation agree.
fn short_batches(b: &BigBatch) -> Option<Diagnosis> {
    let p = Parting::new(None, None, None, Numbers::ShortBatches { shorts: b.shorts });
    (!b.decisive).then(|| cautioned(&p, &b.comparison.left, &b.comparison.right))
}

/// Each run against the golden's trace of the same run (their ends: the steps were
/// streamed), and which golden it was.
fn goldens(
    (g, [ga, gd], gb): (Golden, [Comparer; 2], Option<Comparer>),
    acc_end: &Trace,
    ddp_end: &Trace,
    big: Option<&Trace>,
) -> (Vec<Comparison>, Option<String>) {
    let mut cmps = vec![
        ga.finish(acc_end, &g.accumulation.without_steps(), true),
        gd.finish(ddp_end, &g.ddp.without_steps(), true),
    ];
    if let (Some(gb), Some(ours), Some(theirs)) = (gb, big, &g.big_batch) {
        cmps.push(gb.finish(&ours.without_steps(), &theirs.without_steps(), true));
    }
    let made = match &g.meta.tool_version {
        Some(tool) => format!("{} (blessed by ddp-verify {tool}, libtorch {})", g.dir.display(), g.meta.torch_version),
        None => format!("{} (PyTorch {})", g.dir.display(), g.meta.torch_version),
    };
    (cmps, Some(made))
}

/// How traces recorded elsewhere are judged: by the labels their file names give, the fixed
/// tolerance of their coarsest dtype (they carry no derived bound), the final weights held
/// to AdamW's carried bound where it can be carried (else judged only where the optimizer
/// does not amplify rounding), and their buffers where both are runs of one kind.
fn of_traces(
    a: &mut Trace,
    b: &Trace,
    big: Option<&mut BigLeg>,
    (precision, precision_ddp): (Option<&Trace>, Option<&Trace>),
    opts: &CompareOptions,
    sampled: [bool; 2],
) -> Bench {
    let dtype = a.finals.first().and_then(|(_, t)| t.dtype()).unwrap_or(Dtype::Float32);
    // A narrow dtype's rounding is measured by the precision control, never assumed: the
    // tolerance of wide gradients (the reduction's order), plus what the controls' distance
    // allows; without a control, that tolerance alone.
    let given = opts.tolerance.given();
    let wanted = super::precision::wanted(a, b).filter(|_| !given);
    let tolerance = match given {
        true => super::precision::given_tolerance(a, b, dtype, &opts.tolerance),
        false => super::precision::unmeasured_tolerance(a, b, dtype),
    };
    let labels = labels(&opts.paths);
    // Two runs of one kind must agree in their buffers too; DDP's follow rank 0 only.
    let same_kind = a.header.run.is_some() && a.header.run == b.header.run;
    let regroup = !opts.tolerance.given();
    let regrouped: Vec<u32> = a
        .facts
        .stages
        .iter()
        .zip(&b.facts.stages)
        .map(|(x, y)| x.regrouped(y).map_or(1, |k| u32::try_from(k).unwrap_or(u32::MAX)))
        .collect();
    let held = wanted.map(|w| match (precision, precision_ddp) {
        (None, _) => Err("none ran (ddp-verify -- COMMAND runs one; compare DIR reads it back)".into()),
        (Some(_), None) if w.both => Err("the legs reach their precision otherwise, and the DDP leg's own control \
             is missing"
            .into()),
        (Some(ctl), ddp_ctl) => super::precision::hold(a, ctl, ddp_ctl.map(|c| (b, c)), &tolerance, &regrouped),
    });
    // Under AdamW the final weights are held to what its steps make of each step's allowance;
    // where a precision control held the runs, to what the control's own final weights
    // measured (it ran the same optimizer over the same rounding).
    let finals_carried = match &held {
        Some(Ok(_)) => Err("the precision control measured them".to_string()),
        _ => adamw_finals(a, b, &tolerance, dtype).map(|bounds| a.allowances.finals = bounds),
    };
    let bounded = finals_carried.is_ok() || matches!(held, Some(Ok(_)));
    let runs = traces_comparer([&labels[0], &labels[1]], &tolerance, bounded).regroupable(regroup);
    let finals_unbounded = !bounded && !finals_judged(a, b);
    // Accumulation against a big-batch trace: one process, one batch of each step's samples.
    // A mismatch there while DDP agrees is a normalisation both runs share (a per-micro-batch
    // mean over samples or tokens of varying count).
    // A narrow run's big batch rounds each narrow op over all K·B samples at once, another
    // grouping's rounding anew: held to what the precision control measured, as DDP is.
    let big = big.map(|leg| {
        let (acc, trace) = (&mut leg.accumulation, &leg.trace);
        let (carried, finals) = match &held {
            Some(Ok(_)) => {
                acc.allowances.steps = a.allowances.steps.clone();
                (Ok(()), Some(super::NotJudged::NarrowBigBatch))
            }
            _ => (adamw_finals(acc, trace, &tolerance, dtype).map(|bounds| acc.allowances.finals = bounds), None),
        };
        let cmp = traces_comparer([&labels[0], "big batch"], &tolerance, carried.is_ok()).regroupable(regroup);
        (cmp.finals_not_judged(finals), false)
    });
    let pair = TracePair {
        paths: opts.paths.clone(),
        headers: [a.header.clone(), b.header.clone()],
        tolerance,
        plot: opts.plot.clone(),
        magnitudes: !a.scales.is_empty() && !b.scales.is_empty(),
        peaks: !a.peaks.is_empty() && !b.peaks.is_empty(),
        finals_carried,
        big: opts.big.clone(),
        sampling: SampledPair::of(a, b, sampled),
        precision: held,
    };
    Bench {
        subject: Subject::Traces(Box::new(pair)),
        runs,
        buffers: opts.strict_buffers || same_kind,
        big,
        golden: None,
        context: Context::of_traces(a, b),
        streamed: false,
        finals_unbounded,
    }
}

/// Two traces' comparer: the final weights held to AdamW's carried bound (`carried`, set as
/// `a`'s allowances), else to the fixed tolerance (where the optimizer may amplify rounding
/// past it, a control decides: `control::wanted`).
fn traces_comparer(labels: [&str; 2], tolerance: &Tolerance, carried: bool) -> Comparer {
    Comparer::new(labels[0], labels[1], tolerance, None).derived(carried)
}

/// What each side is called in reports: its file name without `.safetensors`, or the
/// whole path where both have the same name.
fn labels([a, b]: &[PathBuf; 2]) -> [String; 2] {
    let stem = |p: &PathBuf| p.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let (sa, sb) = (stem(a), stem(b));
    if sa != sb && !sa.is_empty() && !sb.is_empty() {
        [sa, sb]
    } else {
        [a.display().to_string(), b.display().to_string()]
    }
}

/// Every comparison a verification makes, fed one optimizer step at a time, then finished
/// into the [`Outcome`] by [`judge`].
pub struct Judging {
    config: Config,
    /// Accumulation vs DDP, held to the derived bounds unless a tolerance was given.
    runs: Comparer,
    /// Accumulation vs the big batch, likewise (its own bound: `train::Bounds`).
    big: Option<Comparer>,
    /// Accumulation vs the golden's, DDP vs the golden's (and the big batch vs the golden's,
    /// where both exist); goldens keep the fixed tolerance and their buffers always count.
    golden: Option<(Golden, [Comparer; 2], Option<Comparer>)>,
}

impl Judging {
    pub fn new(cfg: &Config, golden: Option<Golden>) -> Self {
        let tol = &cfg.tolerance;
        let golden = golden.map(|g| {
            let sample = g.meta.sample;
            let cmps = [
                Comparer::new("accumulation", "golden accumulation", tol, sample),
                Comparer::new("ddp", "golden ddp", tol, sample),
            ];
            let big = (g.big_batch.is_some() && cfg.train.with_big_batch())
                .then(|| Comparer::new("big batch", "golden big batch", tol, sample));
            (g, cmps, big)
        });
        let runs = Comparer::new("accumulation", "ddp", tol, None).derived(cfg.derive_bounds);
        let big = cfg
            .train
            .with_big_batch()
            .then(|| Comparer::new("accumulation", "big batch", tol, None).derived(cfg.derive_bounds));
        Judging { config: cfg.clone(), runs, big, golden }
    }

    /// Step `s` of both runs; `allowed` is what the accumulation run derived for it; `big`
    /// the big batch's gradients with what they may differ by. An empty side means that run
    /// made no such step.
    pub fn step(
        &mut self,
        s: usize,
        accumulation: &Params,
        ddp: &Params,
        allowed: &Params,
        big: Option<(&Params, &Params)>,
    ) {
        let none = Params::new();
        self.runs.step(accumulation, ddp, allowed);
        if let (Some(cmp), Some((b, allowed_big))) = (self.big.as_mut(), big) {
            cmp.step(accumulation, b, allowed_big);
        }
        if let Some((g, [ga, gd], gb)) = self.golden.as_mut() {
            ga.step(accumulation, g.accumulation.steps.get(s).unwrap_or(&none), &none);
            gd.step(ddp, g.ddp.steps.get(s).unwrap_or(&none), &none);
            if let (Some(gb), Some((b, _)), Some(golden_big)) = (gb.as_mut(), big, &g.big_batch) {
                gb.step(b, golden_big.steps.get(s).unwrap_or(&none), &none);
            }
        }
    }

    /// Every step the finished runs recorded.
    pub fn steps_of(&mut self, accumulation: &Trace, ddp: &Trace, big: Option<&Trace>) {
        let none = Params::new();
        let big_steps = big.map_or(0, |b| b.steps.len());
        for s in 0..accumulation.steps.len().max(ddp.steps.len()).max(big_steps) {
            let (a, d) = (accumulation.steps.get(s).unwrap_or(&none), ddp.steps.get(s).unwrap_or(&none));
            let b = big.map(|b| (b.steps.get(s).unwrap_or(&none), accumulation.allowances.big.get(s).unwrap_or(&none)));
            self.step(s, a, d, accumulation.allowances.steps.get(s).unwrap_or(&none), b);
        }
    }

    /// Final weights and buffers, then the outcome ([`judge`]). The traces keep whatever
    /// steps were kept for reports and saving; those were judged already, through
    /// [`Judging::step`].
    pub fn finish(self, accumulation: Trace, ddp: Trace, big: Option<Trace>) -> Outcome {
        // The big batch is held to its own allowances (`Trace::for_big_batch`).
        let big = big.map(|trace| BigLeg {
            accumulation: Trace {
                steps: accumulation.steps.clone(),
                scales: accumulation.scales.clone(),
                ..accumulation.without_steps().for_big_batch()
            },
            trace,
        });
        judge(
            Legs { accumulation, ddp, big, sampled: [false; 2], control: None, precision: None, precision_ddp: None },
            Terms::Run(Box::new(self)),
        )
    }

    /// Our own runs' terms: by the configuration (its plan says what each step held).
    fn bench(self) -> Bench {
        Bench {
            context: Context::of_run(&self.config.train),
            buffers: self.config.strict_buffers,
            subject: Subject::Run(Box::new(self.config)),
            runs: self.runs,
            big: self.big.map(|cmp| (cmp, true)),
            golden: self.golden,
            streamed: true,
            finals_unbounded: false,
        }
    }
}

impl Outcome {
    /// No runs, no comparisons: the kernels did not repeat themselves.
    pub fn no_verdict(cfg: &Config, why: Unrepeatable) -> Outcome {
        let outcome = Judging::new(cfg, None).finish(Trace::default(), Trace::default(), None);
        Outcome { no_verdict: Some(why), ..outcome }
    }
}

#[cfg(test)]
#[path = "judgement_tests.rs"]
mod tests;
