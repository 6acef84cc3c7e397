//! What a judgement hands on: the [`Outcome`] of accumulation vs DDP (and the big batch, and
//! each run vs its golden), its verdict, the likely cause of a mismatch, and what it was
//! about (a run or a pair of traces). `judgement` assembles it.

use std::path::PathBuf;

use super::{Agreement, Comparison, Diagnosis, LegCost, Verdict};
use crate::evidence::Unrepeatable;
use crate::evidence::{Trace, TraceHeader};
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
    /// Where a precision control ran: what it held the runs to, or why it could not.
    pub precision: Option<Result<super::PrecisionHeld, String>>,
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
    /// A user's runs that part as amplified rounding might, judged NOT EQUIVALENT until a
    /// control run says otherwise: the nudge it needs (`judge::control`). The job that can
    /// run one does, and judges again with it.
    pub control_wanted: Option<f64>,
    /// A user's legs that ran narrower than float32 where they may round otherwise, with no
    /// precision control yet: the divisor it replays and whether the DDP leg runs one too
    /// (`judge::precision`). The job that can run them does, and judges again with them.
    pub precision_wanted: Option<super::precision::Wanted>,
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
    /// What ddp-verify did around a user's legs that the verdict rests on (a leg stopped
    /// when it hung after its trace was complete, a leg's files moved aside, CUDA run on the
    /// CPU, dropout off), one line each, said beside the verdict.
    pub notes: Vec<String>,
    /// Each run's synchronisation and time per step, where recorded.
    pub costs: Vec<LegCost>,
}

/// The third run: one process, one micro-batch of all a step's samples, normalised over
/// the whole step. A normalisation both other runs get wrong alike shows only against it.
pub struct BigBatch {
    pub trace: Trace,
    pub comparison: Comparison,
    pub diagnosis: Option<Diagnosis>,
    /// Whether its comparison counts in the verdict: not where it parts only because the
    /// one process averaged short micro-batches alone, and DDP agrees (then a caution).
    pub decisive: bool,
    /// The short micro-batches per epoch the one process recorded.
    pub shorts: usize,
}

impl Outcome {
    /// How the runs agree, over every comparison made.
    pub fn agreement(&self) -> Agreement {
        let undecided = self.big_batch.as_ref().filter(|b| !b.decisive).map(|b| &b.comparison);
        let counted = self.comparisons().into_iter().filter(|c| !undecided.is_some_and(|u| std::ptr::eq(*c, u)));
        counted.map(|c| c.verdict).fold(Agreement::Exact, Agreement::max)
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

    /// What the DDP run's synchronisation cost per step, where recorded.
    pub fn ddp_cost(&self) -> Option<&LegCost> {
        self.costs.iter().find(|c| c.label == self.runs.right)
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
