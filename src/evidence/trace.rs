//! What one run emits: the gradient each optimizer step used, the final weights and buffers,
//! and what was recorded around each step. On disk: safetensors, named and typed by the
//! table in [`super::schema`] (`grads.<step>.<param>`, `final.<param>`, `buffer.<name>`, ...),
//! with a typed header ([`TraceHeader`]); `Trace::load` reads by that table.

use super::header::TraceHeader;
use super::schema::Kind as Tensors;
use super::values::Values;

/// Named tensors sorted by name.
pub type Params = Vec<(String, Values)>;

/// What a DDP rank held differently from rank 0.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "what", content = "name", rename_all = "kebab-case")]
pub enum RankHeld {
    /// A parameter's weights.
    Param(String),
    /// A parameter's gradient: not (fully) all-reduced.
    Grad(String),
    /// An optimizer state tensor (`exp_avg.<name>`).
    OptimizerState(String),
    /// Another number of tensors (a rank whose optimizer never stepped holds no state yet).
    TensorCount { theirs: usize, rank0: usize },
}

impl std::fmt::Display for RankHeld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RankHeld::Param(n) => write!(f, "param {n}"),
            RankHeld::Grad(n) => write!(f, "grad {n}"),
            RankHeld::OptimizerState(n) => write!(f, "{n}"),
            RankHeld::TensorCount { theirs, rank0 } => {
                write!(f, "number of tensors ({theirs} vs rank 0's {rank0}: optimizer state)")
            }
        }
    }
}

/// The first tensor a DDP rank held differently from rank 0 after a step
/// (`dist::fingerprint`, or the recorder's `rank_bits.<step>.<param>`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RankDrift {
    pub step: usize,
    pub rank: usize,
    pub tensor: RankHeld,
}

impl RankDrift {
    /// The parameter whose gradient the rank did not synchronise, where that is what differs.
    pub fn unsynced_grad(&self) -> Option<&str> {
        match &self.tensor {
            RankHeld::Grad(n) => Some(n),
            _ => None,
        }
    }
}

#[derive(Debug, Default)]
pub struct Trace {
    /// The file's header (empty where it has none, and for runs not yet saved).
    pub header: TraceHeader,
    /// `steps[s]`: the gradients optimizer step `s` (counted from 0) applied.
    pub steps: Vec<Params>,
    pub finals: Params,
    /// BatchNorm running statistics and counters at the end (empty for the linear model).
    pub buffers: Params,
    /// Largest magnitude each weight took during training (initial and after every step).
    /// SGD rounds a weight at that scale, so final weights are compared there. Empty for
    /// PyTorch's golden traces, which do not record it.
    pub peaks: Params,
    /// Per step and element, the sum of |micro-batch gradient| that made the step's gradient
    /// (recorded by `ddp_verify_trace`): rounding is relative to it where terms cancel.
    pub scales: Vec<Params>,
    /// What each step did besides its gradients: learning rates, clips, syncs, the scaler.
    pub facts: StepFacts,
    /// The accumulation run's: what rounding alone may make the other runs differ by.
    pub allowances: Allowances,
    /// A sampled trace's positions and summaries: its sampled parameters' tensors above
    /// hold only the kept elements.
    pub sampling: Option<super::sampled::Sampling>,
}

/// What was recorded of each step besides its numbers: facts two runs of one training share.
#[derive(Debug, Clone, Default)]
pub struct StepFacts {
    /// The learning rate each step applied (the first param group's), when recorded.
    pub lrs: Vec<f64>,
    /// How many times each step clipped its gradients, when recorded: once per step is
    /// right, once per micro-batch clips partial sums.
    pub clips: Vec<i64>,
    /// The recorder's: per step, the last clip's (total norm before clipping, max_norm),
    /// where clip_grad_norm_ ran.
    pub clip_norms: Vec<Option<(f64, f64)>>,
    /// The recorder's: backward passes this rank made per step (K/W in DDP).
    pub micro: Vec<i64>,
    /// The recorder's, under DDP: per step, whether each DistributedDataParallel forward's
    /// backward was to be all-reduced (DDP decides at the end of the forward). Empty where
    /// no DDP forward was seen.
    pub ddp_sync: Vec<Vec<bool>>,
    /// The recorder's, under a multi-process engine: per step, one rank's gradient
    /// collectives and their bytes (DDP's buckets per synchronised backward, FSDP2's
    /// reduce-scatters), where recorded.
    pub comm: Vec<Option<(i64, i64)>>,
    /// The recorder's: per step, wall seconds since the previous step (none for the first).
    pub seconds: Vec<Option<f64>>,
    /// A DDP rank's: the first step at which some rank held another model or gradient than
    /// rank 0 (DDP all-reduces into identical gradients, so a difference is a gradient not
    /// synchronised).
    pub rank_drift: Option<RankDrift>,
    /// The recorder's: per step, every optimizer's param groups and their settings (empty
    /// where not recorded; a step's list empty where that step's was not).
    pub groups: Vec<Vec<super::Group>>,
    /// tiny-lm with dropout, ours: per step, a digest of the keys its masks were drawn from
    /// (`plan::dropout::digest`; all ranks' summed in DDP). Runs that key masks alike agree.
    pub dropout_keys: Vec<f64>,
    /// Under a loss scaler: its record, per step.
    pub scaler: ScalerRecord,
    /// The recorder's stage facts, per step (empty where none were recorded).
    pub stages: Vec<super::StageStep>,
}

/// The accumulation run's (`train::Bounds`): per step and element, what rounding alone may
/// make DDP's and the big batch's gradients differ by, and likewise for the final weights.
#[derive(Debug, Default)]
pub struct Allowances {
    pub steps: Vec<Params>,
    pub finals: Params,
    pub big: Vec<Params>,
    /// The big batch's final weights and moments, under AdamW (whose updates amplify a
    /// gradient's rounding where it is noise); empty otherwise.
    pub big_finals: Params,
    /// Under `--amp float16`: where float16's range parts the runs.
    pub range_parts: Option<RangePrediction>,
}

/// Steps at which DDP's loss scaler finds inf/NaN where accumulation's does not, or the
/// reverse, as the accumulation run predicted by replaying DDP's arithmetic: a rank's loss
/// share is 1/(K/W), W times accumulation's 1/K, so its scaled float16 values overflow first.
/// That is float16's range, not a bug; the runs then apply different steps. In lockstep every
/// step restarts from accumulation's weights and scaler, so only those steps part; free-running,
/// the runs part for good at the first (`carries`), and only that one is recorded.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RangePrediction {
    pub steps: Vec<usize>,
    pub carries: bool,
}

impl RangePrediction {
    /// In a trace file: `range_part.<step>`, float32 [1], 1 when the runs part for good.
    pub fn tensors(&self) -> Params {
        let mark = f32::from(u8::from(self.carries));
        self.steps.iter().map(|&s| (Tensors::RangePart.name(s, ""), Values::f32s(vec![mark]))).collect()
    }
}

/// What a GradScaler did at each optimizer step: the scale the step's losses were multiplied
/// by, whether it found inf/NaN and skipped the step, and, in our own runs, how many times
/// the step unscaled the gradients and updated the scale: once each is right. All compared
/// exactly; empty without a scaler.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ScalerRecord {
    pub scales: Vec<f64>,
    pub found_inf: Vec<bool>,
    pub unscales: Vec<i64>,
    pub updates: Vec<i64>,
}

impl ScalerRecord {
    /// Each recorded series as `(name, tensor)` for a trace file.
    pub fn tensors(&self) -> Params {
        let f32s = |v: f64| Values::f32s(vec![v as f32]);
        let series = |kind: Tensors, values: Vec<Values>| -> Params {
            values.into_iter().enumerate().map(|(s, t)| (kind.name(s, ""), t)).collect()
        };
        let mut out = series(Tensors::LossScale, self.scales.iter().map(|&v| f32s(v)).collect());
        out.extend(series(Tensors::FoundInf, self.found_inf.iter().map(|&f| f32s(f64::from(u8::from(f)))).collect()));
        out.extend(series(Tensors::Unscales, self.unscales.iter().map(|&n| Values::i64s(vec![n])).collect()));
        out.extend(series(Tensors::ScalerUpdates, self.updates.iter().map(|&n| Values::i64s(vec![n])).collect()));
        out
    }
}

impl Trace {
    /// The accumulation run's trace as the big batch is judged against it: the big batch's
    /// allowances in place of DDP's (under SGD none for the finals, which keep the fixed
    /// tolerance at their peaks; AdamW carries one).
    pub fn for_big_batch(self) -> Trace {
        let a = self.allowances;
        let allowances = Allowances {
            steps: a.big,
            finals: a.big_finals,
            big: Vec::new(),
            big_finals: Params::new(),
            range_parts: a.range_parts,
        };
        Trace { allowances, ..self }
    }

    /// The same finals, buffers and peaks (shared, not copied), without the steps.
    pub fn without_steps(&self) -> Trace {
        let a = &self.allowances;
        Trace {
            header: self.header.clone(),
            steps: Vec::new(),
            finals: self.finals.clone(),
            buffers: self.buffers.clone(),
            peaks: self.peaks.clone(),
            scales: Vec::new(),
            facts: self.facts.clone(),
            sampling: self.sampling.clone(),
            allowances: Allowances {
                steps: Vec::new(),
                finals: a.finals.clone(),
                big: Vec::new(),
                big_finals: a.big_finals.clone(),
                range_parts: a.range_parts.clone(),
            },
        }
    }
}
