//! A verification's judgement, assembled one way whether the steps streamed in (lockstep)
//! or come from finished traces (free-running): accumulation vs DDP, each run vs its
//! golden, and the likely cause of a mismatch.

use std::path::PathBuf;

use super::{diagnose, Agreement, Comparer, Comparison, Context, Diagnosis, Verdict};
use crate::evidence::Unrepeatable;
use crate::evidence::{Golden, Params, Trace, TraceHeader};
use crate::spec::{Config, Tolerance};

/// What was judged: two runs ddp-verify trained, or two traces a user recorded.
pub enum Subject {
    Run(Box<Config>),
    Traces(Box<TracePair>),
}

/// `compare A B`: the two files, what their headers say, and how they were judged.
pub struct TracePair {
    pub paths: [PathBuf; 2],
    pub headers: [TraceHeader; 2],
    pub tolerance: Tolerance,
    pub plot: Option<PathBuf>,
    /// Both traces carry per-step micro-batch magnitudes (`scale.<step>.<param>`).
    pub magnitudes: bool,
    /// Both carry each weight's largest magnitude during training (`peak.<param>`).
    pub peaks: bool,
    /// How the final weights were held: Ok where the step allowance was carried through
    /// AdamW (`judge::adamw_finals`), else why it could not be.
    pub finals_carried: Result<(), String>,
    /// The big-batch trace, when one was given.
    pub big: Option<PathBuf>,
    /// Where the pair was judged sampled: what was kept.
    pub sampling: Option<SampledPair>,
    /// Each run's synchronisation and time per step, where recorded.
    pub costs: Vec<super::LegCost>,
}

/// A sampled pair: N elements kept of each tensor larger than that, and the summaries.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SampledPair {
    /// N.
    pub size: usize,
    /// Tensors sampled, of `tensors_all` parameters.
    pub tensors: usize,
    pub tensors_all: usize,
    /// Elements in all parameters, where a header says.
    pub parameters: Option<usize>,
    /// Which trace was recorded sampled (the other `compare` sampled at its positions).
    pub recorded: [bool; 2],
}

impl SampledPair {
    /// What a pair judged sampled kept, or None for a whole pair.
    pub fn of(a: &Trace, b: &Trace, recorded: [bool; 2]) -> Option<SampledPair> {
        let s = a.sampling.as_ref()?;
        Some(SampledPair {
            size: s.size,
            tensors: s.params.len(),
            tensors_all: a.finals.len(),
            parameters: a.header.parameters.or(b.header.parameters),
            recorded,
        })
    }
}

pub struct Outcome {
    pub subject: Subject,
    pub accumulation: Trace,
    pub ddp: Trace,
    /// Accumulation vs DDP: the claim under test.
    pub runs: Comparison,
    /// Accumulation vs one big batch of each step's samples, where the model has one.
    pub big_batch: Option<BigBatch>,
    /// Each run against the golden's trace of the same run, when `--golden` is given.
    pub golden: Vec<Comparison>,
    /// Which golden, and what made it.
    pub golden_torch: Option<String>,
    /// Likely cause of an accumulation/DDP mismatch, in plain words.
    pub diagnosis: Option<Diagnosis>,
    /// The kernels gave other bits for the same micro-batch (`train::repeat_check`): no
    /// verdict, nothing was trained or compared.
    pub no_verdict: Option<Unrepeatable>,
    /// An equivalence that holds only for now (a factor clipping hides at every step): said
    /// beside the verdict, which it does not change.
    pub caution: Option<Diagnosis>,
}

/// The third run: one process, one micro-batch of all a step's samples, normalised over
/// the whole step. A normalisation both other runs get wrong alike shows only against it.
pub struct BigBatch {
    pub trace: Trace,
    pub comparison: Comparison,
    pub diagnosis: Option<Diagnosis>,
}

impl Outcome {
    /// How the runs agree, over every comparison made.
    pub fn agreement(&self) -> Agreement {
        self.comparisons().iter().map(|c| c.verdict).fold(Agreement::Exact, Agreement::max)
    }

    /// Equivalent, not, or no verdict: what reports say and the process exits with.
    pub fn verdict(&self) -> Verdict {
        match (self.no_verdict.is_some(), self.agreement()) {
            (true, _) => Verdict::NoVerdict,
            (false, Agreement::Diverged) => Verdict::NotEquivalent,
            (false, _) => Verdict::Equivalent,
        }
    }

    /// Every comparison made, the claim under test first: accumulation vs DDP, vs the big
    /// batch, then each run vs its golden.
    pub fn comparisons(&self) -> Vec<&Comparison> {
        std::iter::once(&self.runs).chain(self.big_batch.as_ref().map(|b| &b.comparison)).chain(&self.golden).collect()
    }

    /// No runs, no comparisons: the kernels did not repeat themselves.
    pub fn no_verdict(cfg: &Config, why: Unrepeatable) -> Outcome {
        let outcome = Judging::new(cfg, None).finish(Trace::default(), Trace::default(), None);
        Outcome { no_verdict: Some(why), ..outcome }
    }

    /// 0 equivalent, 1 not, 4 no verdict: what a verification or `compare` exits with.
    pub fn exit(&self) -> crate::error::Exit {
        self.verdict().exit()
    }

    /// The verification's config, when ddp-verify trained the runs.
    pub fn config(&self) -> Option<&Config> {
        match &self.subject {
            Subject::Run(c) => Some(c.as_ref()),
            Subject::Traces(_) => None,
        }
    }

    /// The fixed tolerance (the runs may have been held to derived bounds instead).
    pub fn tolerance(&self) -> &Tolerance {
        match &self.subject {
            Subject::Run(c) => &c.tolerance,
            Subject::Traces(t) => &t.tolerance,
        }
    }

    pub fn plot(&self) -> Option<&PathBuf> {
        match &self.subject {
            Subject::Run(c) => c.plot.as_ref(),
            Subject::Traces(t) => t.plot.as_ref(),
        }
    }
}

/// Every comparison a verification makes, fed one optimizer step at a time, then finished
/// into the [`Outcome`].
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

    /// Final weights and buffers, then the outcome. The traces keep whatever steps were
    /// kept for reports and saving; those were judged already, through [`Judging::step`].
    pub fn finish(self, accumulation: Trace, ddp: Trace, big: Option<Trace>) -> Outcome {
        let (acc_end, ddp_end) = (accumulation.without_steps(), ddp.without_steps());
        let runs = self.runs.finish(&acc_end, &ddp_end, self.config.strict_buffers);
        let context = Context::of_run(&self.config.train);
        let big_end = big.as_ref().map(Trace::without_steps);
        let big_batch = match (self.big, big) {
            (Some(cmp), Some(trace)) => {
                let acc_end = accumulation.without_steps().for_big_batch();
                let comparison = cmp.finish(&acc_end, &trace.without_steps(), true);
                let diagnosis = diagnose::big_batch(
                    &accumulation,
                    &trace,
                    &comparison,
                    &context,
                    runs.verdict != Agreement::Diverged,
                );
                Some(BigBatch { trace, comparison, diagnosis })
            }
            _ => None,
        };
        let (golden, golden_torch) = match self.golden {
            Some((g, [ga, gd], gb)) => {
                let mut cmps = vec![
                    ga.finish(&acc_end, &g.accumulation.without_steps(), true),
                    gd.finish(&ddp_end, &g.ddp.without_steps(), true),
                ];
                if let (Some(gb), Some(ours), Some(theirs)) = (gb, &big_end, &g.big_batch) {
                    cmps.push(gb.finish(ours, &theirs.without_steps(), true));
                }
                let made = match &g.meta.tool_version {
                    Some(tool) => {
                        format!("{} (blessed by ddp-verify {tool}, libtorch {})", g.dir.display(), g.meta.torch_version)
                    }
                    None => format!("{} (PyTorch {})", g.dir.display(), g.meta.torch_version),
                };
                (cmps, Some(made))
            }
            None => (Vec::new(), None),
        };
        let diagnosis = diagnose(&accumulation, &ddp, &runs, &context);
        let subject = Subject::Run(Box::new(self.config));
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
            caution: None,
        }
    }
}
