//! Training: the seeded data, the models, SGD, and the two runs, each driven through the
//! step plan it is handed (`plan::RunPlan`) by one loop; lockstep drives both at once.

mod accumulation;
mod bounds;
pub mod data;
mod ddp;
mod dropout;
pub mod fits;
pub mod host;
mod listen;
mod lockstep;
pub mod models;
pub mod optim;
mod repeat;
mod scaler;

pub use crate::evidence::Unrepeatable;
pub use accumulation::{accumulation, accumulation_run, big_batch, big_batch_run};
pub use bounds::{Bounds, Clip};
pub use ddp::{ddp_rank, ddp_run};
use listen::Listener;
pub use lockstep::{lockstep, StepGrads, StepSink};
pub use repeat::repeat_check;

use tch::Tensor;

use self::data::Data;
use self::models::Model;
use self::optim::Optimizer;
use self::scaler::Scaler;
use crate::dist::{self as collective, Collective};
use crate::error::Result;
use crate::evidence::{Allowances, Params, RangePrediction, RankHeld, ScalerRecord, StepFacts, Trace};
use crate::plan::{Counts, Normaliser, Planted, RunPlan, StepPlan};
use crate::spec::TrainConfig;
use host::snapshot;

/// One micro-batch's loss, as a run backpropagates it.
pub struct MicroBatchLoss<'a> {
    pub loss: &'a Tensor,
    /// What accumulation divides this loss by (K, or the step's token count).
    pub divisor: f64,
    /// The terms each gradient element sums over in this micro-batch.
    pub rows: usize,
    pub params: &'a [Tensor],
    /// The loss scale under `--amp float16`, which both runs multiply each loss by.
    pub scale: Option<&'a Tensor>,
}

/// A run's weights and buffers as [`collective::flatten`] makes them.
pub struct State(Vec<Tensor>);

/// What makes a DDP rank differ from the single process.
pub struct DdpSide<'a> {
    pub comm: &'a dyn Collective,
    /// `broadcast_buffers=True`: rank 0's buffers are copied to every rank before a forward
    /// that follows a gradient-synchronised one (DDP's `require_forward_param_sync`).
    pub broadcast_buffers: bool,
    pub start: DdpStart,
}

/// Where a DDP rank's weights come from before its first step.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum DdpStart {
    /// DDP's constructor: rank 0's initialisation, broadcast. The other ranks skip their
    /// own, which the broadcast would overwrite.
    Broadcast,
    /// Lockstep: every rank restarts from the accumulation run before every step, so no
    /// rank initialises or broadcasts at construction.
    Restarted,
}

/// Whether a run derives, from its own arithmetic, what the others may differ by: the
/// accumulation run does (`train::Bounds`); the others are held to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Derives {
    Bounds,
    Nothing,
}

/// What a run records for its trace beside each step's gradients.
#[derive(Default)]
struct Recorded {
    /// Clipping calls each step made.
    clips: Vec<i64>,
    /// A DDP rank: the first step at which some rank held another model than rank 0.
    rank_drift: Option<crate::evidence::RankDrift>,
    /// Each step's digest of the keys its dropout masks were drawn from (all ranks'
    /// together in DDP).
    dropout_keys: Vec<f64>,
    /// Per step under DDP: the all-reduces and the bytes this rank sent into them.
    comm: Vec<Option<(i64, i64)>>,
    /// What the loss scaler did each step.
    scaler: ScalerRecord,
    /// The accumulation run's prediction of where float16's range parts it from DDP.
    range_parts: Option<RangePrediction>,
}

/// One run in one process: model, data, optimizer, and the steps it will take.
pub struct Run<'a> {
    model: Box<dyn Model>,
    data: Data,
    opt: Optimizer,
    /// Its steps and loss normalisation, from `plan::RunPlan`.
    plan: StepPlan,
    norm: Normaliser,
    /// The planted bug this run carries (`plan::Planted`), asked where the run could do
    /// otherwise.
    planted: Planted,
    /// Each step's learning rate, and the clipping (see `plan::RunPlan`).
    lrs: Vec<f64>,
    clip: Option<f64>,
    /// A schedule other than constant was asked for.
    lr_scheduled: bool,
    /// What the run records for its trace, step by step, beside the gradients.
    recorded: Recorded,
    /// The parameters in PyTorch's order, in which clipping sums their norms.
    torch_order: Vec<usize>,
    /// tiny-lm's dropout, and the sample counter a run keys it by under `dropout-same-seed`
    /// (epoch, samples so far).
    dropout: Option<dropout::Dropout>,
    counter: (Option<u64>, i64),
    /// `--amp float16`'s GradScaler; the micro-batch made to overflow (step, index in the
    /// window); and whether a micro-batch unscaled so far this window
    /// (`unscale-per-micro-batch`) found inf/NaN.
    scaler: Option<Scaler>,
    overflow: Option<(usize, usize)>,
    found_in_window: bool,
    ddp: Option<DdpSide<'a>>,
    /// Largest |w| seen per weight: SGD rounds a weight at that scale.
    peaks: Vec<Tensor>,
    /// Whether anyone reads this run's trace: the accumulation run and DDP rank 0. The
    /// other ranks' gradients and peaks are never looked at, so they are not kept.
    traced: bool,
    /// Lockstep: whether this run has restarted from the accumulation run yet.
    restarted: bool,
    /// Who hears what the run does: the accumulation run's bounds (what rounding may make
    /// DDP differ by, see `bounds`), else a listener that only backpropagates.
    listener: Box<dyn Listener>,
    /// What the last step's gradients may differ by, until taken: from DDP's, and from
    /// the big batch's.
    allowed: Params,
    allowed_big: Params,
}

impl<'a> Run<'a> {
    fn new(cfg: &TrainConfig, plan: RunPlan, ddp: Option<DdpSide<'a>>, derives: Derives) -> Result<Self> {
        let RunPlan { steps: plan, norm, lrs, clip, overflow, planted } = plan;
        // A DDP rank computes where its collective reaches (cuda:<local rank> with NCCL).
        let device = ddp.as_ref().map_or(crate::spec::accumulation_device(cfg.run.device), |d| d.comm.device());
        let blank = ddp.as_ref().is_some_and(|d| d.start == DdpStart::Restarted || d.comm.rank() != 0);
        let model = models::build(cfg, device, blank)?;
        let torch_order = models::torch_order(model.as_ref());
        let data = Data::new(cfg, device)?;
        let named: Vec<(String, Tensor)> =
            model.parameters().iter().map(|(n, t)| (n.clone(), t.shallow_clone())).collect();
        let mut opt = Optimizer::new(cfg, &named)?;
        opt.zero_grad()?;
        let traced = ddp.as_ref().is_none_or(|d| d.comm.rank() == 0);
        let peaks = match traced {
            true => model.parameters().iter().map(|(_, p)| p.detach().abs()).collect(),
            false => Vec::new(),
        };
        let listener: Box<dyn Listener> = match derives {
            Derives::Bounds => Box::new(Bounds::new(cfg, model.parameters().len())),
            Derives::Nothing => Box::new(listen::Silent),
        };
        let mut run = Run {
            model,
            data,
            opt,
            plan,
            norm,
            planted,
            lrs,
            clip,
            lr_scheduled: cfg.optim.lr_schedule != crate::spec::Schedule::Constant,
            recorded: Recorded {
                range_parts: (derives == Derives::Bounds && cfg.precision.amp.scaled())
                    .then(|| RangePrediction { steps: Vec::new(), carries: !cfg.run.lockstep }),
                ..Recorded::default()
            },
            torch_order,
            dropout: dropout::Dropout::new(cfg, device),
            counter: (None, 0),
            scaler: Scaler::new(cfg, device),
            overflow,
            found_in_window: false,
            ddp,
            peaks,
            traced,
            restarted: false,
            listener,
            allowed: Params::new(),
            allowed_big: Params::new(),
        };
        if let Some(d) = run.ddp.as_ref().filter(|d| d.start == DdpStart::Broadcast) {
            // DDP's constructor broadcasts rank 0's parameters and buffers.
            collective::broadcast_all(d.comm, &run.state_tensors(), 0)?;
            run.track_peaks();
        }
        Ok(run)
    }

    pub fn steps(&self) -> usize {
        self.plan.steps.len()
    }

    /// Runs optimizer step `s`'s micro-batches and the step; returns the gradients it applied.
    pub fn step(&mut self, s: usize) -> Result<Params> {
        let group = std::mem::take(&mut self.plan.steps[s]);
        let divisors = self.divisors(s, &group, true)?;
        let start_scale = self.scaler.as_ref().map(Scaler::value);
        let overflow = self.overflow.filter(|&(step, _)| step == s).map(|(_, j)| j);
        let keys = self.forward_backward(&group, &divisors, self.plan.epochs[s], overflow)?;
        if self.dropout.is_some() {
            let mut keys = [keys];
            if let Some(d) = &self.ddp {
                d.comm.all_reduce_sum_f64(&mut keys)?;
            }
            self.recorded.dropout_keys.push(keys[0]);
        }
        if let Some(d) = &self.ddp {
            // `unsynced-param` leaves out the last parameter PyTorch registers.
            let left_out = self.torch_order.last().copied().filter(|_| self.planted.leaves_out_last_param());
            let params = self.model.parameters().iter().enumerate();
            let grads: Vec<Tensor> = params.filter(|(i, _)| Some(*i) != left_out).map(|(_, (_, p))| p.grad()).collect();
            let comm = collective::average_gradients(d.comm, &grads)?;
            self.recorded.comm.push(Some(comm));
        }
        let found_inf = match start_scale {
            Some(start) => self.unscale(s, group.len(), start)?,
            None => false,
        };
        let params = self.model.parameters();
        let lr = self.lrs[s];
        if self.clip.is_some() {
            self.recorded.clips.push(if self.planted.clips_each_micro_batch() { group.len() as i64 } else { 1 });
        }
        let tensors: Vec<Tensor> = params.iter().map(|(_, p)| p.shallow_clone()).collect();
        let clip = match (self.clip, self.planted.clips_each_micro_batch()) {
            (Some(max), false) => {
                let grads: Vec<Tensor> = self.torch_order.iter().map(|&i| tensors[i].grad()).collect();
                let (total, coef) = optim::clip_coefficient(&grads, max)?;
                Some((Clip { max, total: total.double_value(&[]), coef: coef.double_value(&[]) }, coef))
            }
            _ => None,
        };
        // Before clipping: the bounds follow what clipping does to them.
        let names: Vec<String> = params.iter().map(|(n, _)| n.clone()).collect();
        let grads: Vec<Tensor> = tensors.iter().map(Tensor::grad).collect();
        let applied = (!found_inf).then_some(&grads[..]);
        (self.allowed, self.allowed_big) =
            self.listener.step(&names, applied, &tensors, lr, clip.as_ref().map(|c| c.0));
        if let Some((_, coef)) = &clip {
            optim::clip_apply(&tensors.iter().map(Tensor::grad).collect::<Vec<_>>(), coef)?;
        }
        let grads = match self.traced {
            false => Params::new(),
            true => snapshot(params.iter().map(|(n, p)| (n, p.grad()))),
        };
        self.opt.set_lr(lr)?;
        // `scaler.step(optimizer)`: no step where inf/NaN was found; then `scaler.update()`.
        if !found_inf {
            self.opt.step()?;
            self.listener.stepped(&tensors, &self.opt);
        }
        if let Some(scaler) = self.scaler.as_mut() {
            scaler.update(found_inf)?;
        }
        self.compare_ranks(s)?;
        self.track_peaks();
        if self.planted.zeroes_grads() {
            self.opt.zero_grad()?;
        }
        Ok(grads)
    }

    /// `scaler.unscale_(optimizer)` once per step, after the all-reduce (unless the
    /// per-micro-batch bug did it already), and the scaler's record of step `s`, which held
    /// `n` micro-batches and started at scale `start`; returns whether inf/NaN was found. The
    /// accumulation run also notes where DDP's replayed arithmetic finds otherwise.
    fn unscale(&mut self, s: usize, n: usize, start: f64) -> Result<bool> {
        if self.scaler.is_none() {
            return Ok(false);
        }
        let mut found = std::mem::take(&mut self.found_in_window);
        if !self.planted.unscales_each_micro_batch() {
            found |= self.unscale_grads()?;
        }
        let r = &mut self.recorded.scaler;
        let n = n as i64;
        r.scales.push(start);
        r.found_inf.push(found);
        r.unscales.push(if self.planted.unscales_each_micro_batch() { n } else { 1 });
        r.updates.push(if self.planted.updates_scale_each_micro_batch() { n } else { 1 });
        if let Some(parts) = self.recorded.range_parts.as_mut() {
            // Free-running runs part for good at the first: later predictions start from
            // other weights.
            let ddp_found = self.listener.ddp_found_inf();
            let parted_for_good = parts.carries && !parts.steps.is_empty();
            if ddp_found != found && !parted_for_good {
                parts.steps.push(s);
            }
        }
        Ok(found)
    }

    /// Unscales `.grad` in place (the bounds' partial sums follow, as DDP's scale alike);
    /// whether any held inf or NaN.
    fn unscale_grads(&mut self) -> Result<bool> {
        let Some(scaler) = &self.scaler else { return Ok(false) };
        let inv = scaler.inverse();
        let found = scaler.unscale(&self.model.parameters().iter().map(|(_, p)| p.grad()).collect::<Vec<_>>())?;
        self.listener.rescaled(inv);
        Ok(found)
    }

    /// What the gradients of the step just made may differ by in DDP (empty for DDP runs).
    pub fn take_allowed(&mut self) -> Params {
        std::mem::take(&mut self.allowed)
    }

    /// What they may differ by in the big batch (empty but for the accumulation run).
    pub fn take_allowed_big(&mut self) -> Params {
        std::mem::take(&mut self.allowed_big)
    }

    /// Runs the micro-batches after the last step, then returns the final weights, buffers
    /// and peaks (no steps: the caller has them).
    pub fn finish(mut self) -> Result<Trace> {
        let tail = std::mem::take(&mut self.plan.tail);
        // They make no step, so the bounds need not hear of them.
        let listener = std::mem::replace(&mut self.listener, Box::new(listen::Silent));
        // Never stepped, so its normalisation is never seen: no count is all-reduced.
        let divisors = self.divisors(self.plan.steps.len(), &tail, false)?;
        self.forward_backward(&tail, &divisors, self.plan.tail_epoch, None)?;
        let m = &self.model;
        let params = m.parameters();
        let names: Vec<String> = params.iter().map(|(n, _)| n.clone()).collect();
        let weights: Vec<Tensor> = params.iter().map(|(_, p)| p.shallow_clone()).collect();
        let (allowed_finals, allowed_finals_big) = listener.finals(&names, &weights);
        Ok(Trace {
            allowances: Allowances {
                finals: allowed_finals,
                big_finals: allowed_finals_big,
                range_parts: self.recorded.range_parts,
                ..Allowances::default()
            },
            steps: Vec::new(),
            finals: snapshot(
                m.parameters()
                    .iter()
                    .map(|(n, p)| (n, p.shallow_clone()))
                    .chain(self.opt.state().iter().map(|(n, t)| (n, t.shallow_clone()))),
            ),
            // Recorded where they change (as the reference scripts do): compared exactly.
            facts: StepFacts {
                lrs: if self.lr_scheduled { self.lrs[..self.plan.steps.len()].to_vec() } else { Vec::new() },
                clips: self.recorded.clips,
                rank_drift: self.recorded.rank_drift,
                dropout_keys: self.recorded.dropout_keys,
                comm: self.recorded.comm,
                scaler: self.recorded.scaler,
                ..StepFacts::default()
            },
            buffers: snapshot(m.buffers().iter().map(|(n, b)| (n, b.shallow_clone()))),
            peaks: m.parameters().iter().map(|(n, _)| n.clone()).zip(self.peaks.iter().map(host::host)).collect(),
            ..Trace::default()
        })
    }

    /// Every step, then [`Run::finish`]: a free-running run's whole trace.
    pub fn run_all(mut self) -> Result<Trace> {
        let (mut steps, mut allowed, mut allowed_big) = (Vec::new(), Vec::new(), Vec::new());
        for s in 0..self.steps() {
            steps.push(self.step(s)?);
            allowed.push(self.take_allowed());
            allowed_big.push(self.take_allowed_big());
        }
        allowed.retain(|a| !a.is_empty());
        allowed_big.retain(|a| !a.is_empty());
        let mut trace = Trace { steps, ..self.finish()? };
        trace.allowances.steps = allowed;
        trace.allowances.big = allowed_big;
        Ok(trace)
    }

    /// The weights and buffers, flattened: what another run restarts from in lockstep.
    pub fn state(&self) -> Result<State> {
        Ok(State(collective::flatten(&self.state_tensors())?))
    }

    /// Lockstep: every DDP rank restarts from `state`, which rank 0 holds (None elsewhere).
    /// The first restart gives this run its initial weights, which its peaks must hold;
    /// later ones are the accumulation run's weights, already in that run's peaks.
    pub fn restart_from(&mut self, state: Option<State>, comm: &dyn Collective) -> Result<()> {
        collective::broadcast_into(comm, state.map(|s| s.0), &self.state_tensors(), 0)?;
        if !std::mem::replace(&mut self.restarted, true) {
            self.track_peaks();
        }
        Ok(())
    }

    /// Restarts from another run's `state` in this process (the big batch from the
    /// accumulation run's, in lockstep), with [`Run::restart_from`]'s peaks rule.
    pub fn restart_local(&mut self, state: &State) {
        collective::unflatten(&state.0, &self.state_tensors());
        if !std::mem::replace(&mut self.restarted, true) {
            self.track_peaks();
        }
    }

    /// What each micro-batch of step `s` (`group`) divides its loss by. Token counts are
    /// taken from the data; a DDP rank all-reduces its count first (when `reduce`), so
    /// every rank divides by the step's.
    fn divisors(&self, s: usize, group: &[Vec<i64>], reduce: bool) -> Result<Vec<f64>> {
        let held = group.len();
        let before_shift = self.norm.counts_tokens();
        let count = |mb: &[i64]| before_shift.map_or(0.0, |b| self.data.tokens(mb, b));
        let own: f64 = group.iter().map(|mb| count(mb)).sum();
        let mut step = [own];
        if let (true, true, Some(d)) = (reduce, self.norm.all_reduces(), &self.ddp) {
            d.comm.all_reduce_sum_f64(&mut step)?;
        }
        let counts = |mb: &[i64]| Counts { step: step[0], own, micro_batch: count(mb) };
        Ok(group.iter().map(|mb| self.norm.divisor(s, held, counts(mb))).collect())
    }

    /// A DDP rank, after step `s`: whether every rank holds the same weights, synchronised
    /// gradients and optimizer state as rank 0 (`dist::fingerprint`); the first difference is
    /// kept. Every rank learns the same answer, so all stop comparing together.
    fn compare_ranks(&mut self, s: usize) -> Result<()> {
        let Some(d) = self.ddp.as_ref().filter(|_| self.recorded.rank_drift.is_none()) else { return Ok(()) };
        let params = self.model.parameters();
        let named: Vec<(RankHeld, Tensor)> = params
            .iter()
            .map(|(n, p)| (RankHeld::Param(n.clone()), p.shallow_clone()))
            .chain(params.iter().map(|(n, p)| (RankHeld::Grad(n.clone()), p.grad())))
            .chain(self.opt.state().into_iter().map(|(n, t)| (RankHeld::OptimizerState(n), t)))
            .collect();
        self.recorded.rank_drift = collective::fingerprint::compare_ranks(d.comm, s, &named)?;
        Ok(())
    }

    /// Keeps each weight's largest magnitude so far.
    fn track_peaks(&mut self) {
        if !self.traced {
            return;
        }
        for (peak, (_, p)) in self.peaks.iter().zip(self.model.parameters()) {
            let _ = peak.maximum_out(peak, &p.detach().abs());
        }
    }

    /// Weights, buffers, and the loss scaler's state (lockstep restarts it with the weights).
    fn state_tensors(&self) -> Vec<Tensor> {
        let m = self.model.as_ref();
        let scaler = self.scaler.iter().flat_map(Scaler::state_tensors);
        m.parameters().iter().chain(m.buffers()).map(|(_, t)| t.shallow_clone()).chain(scaler).collect()
    }

    /// Returns the digest of the dropout keys its masks were drawn from (0 without dropout).
    /// `overflow`: the micro-batch whose loss is made to overflow float16 (`--overflow-step`).
    fn forward_backward(
        &mut self,
        group: &[Vec<i64>],
        divisors: &[f64],
        epoch: u64,
        overflow: Option<usize>,
    ) -> Result<f64> {
        let mut digest = 0.0;
        for (j, (idx, &divisor)) in group.iter().zip(divisors).enumerate() {
            if let Some(d) = self.ddp.as_ref().filter(|d| d.broadcast_buffers && j == 0) {
                let buffers: Vec<Tensor> = self.model.buffers().iter().map(|(_, b)| b.shallow_clone()).collect();
                collective::broadcast_all(d.comm, &buffers, 0)?;
            }
            let mut batch = self.data.batch(idx);
            if let Some(d) = &self.dropout {
                if self.counter.0 != Some(epoch) {
                    self.counter = (Some(epoch), 0);
                }
                let keys: Vec<i64> = match self.planted.keys_dropout_by_counter() {
                    // Every rank's n-th sample of the epoch draws the n-th masks.
                    true => (self.counter.1..self.counter.1 + idx.len() as i64).collect(),
                    false => idx.clone(),
                };
                self.counter.1 += idx.len() as i64;
                let (masks, keys) = d.masks(epoch, &keys)?;
                batch.dropout = Some(masks);
                digest += keys;
            }
            let mut loss = self.model.loss(&batch);
            if overflow == Some(j) {
                // A new tensor, as PyTorch's `loss * 2.0**40`: tch's `*=` is in place.
                #[allow(clippy::assign_op_pattern)]
                {
                    loss = loss * crate::spec::OVERFLOW_FACTOR;
                }
            }
            let scale = self.scaler.as_ref().map(|s| s.scale().shallow_clone());
            let params: Vec<Tensor> = self.model.parameters().iter().map(|(_, p)| p.shallow_clone()).collect();
            let rows = batch_rows(&batch);
            let mb = MicroBatchLoss { loss: &loss, divisor, rows, params: &params, scale: scale.as_ref() };
            self.listener.backward(&mb)?;
            if self.planted.unscales_each_micro_batch() {
                self.found_in_window |= self.unscale_grads()?;
            }
            if let Some(scaler) = self.scaler.as_mut().filter(|_| self.planted.updates_scale_each_micro_batch()) {
                if j + 1 < group.len() {
                    scaler.update(false)?;
                }
            }
            if let (true, Some(max)) = (self.planted.clips_each_micro_batch(), self.clip) {
                let params = self.model.parameters();
                let grads: Vec<Tensor> = self.torch_order.iter().map(|&i| params[i].1.grad()).collect();
                let coef = optim::clip_grad_norm(&grads, max)?;
                self.listener.rescaled(coef);
            }
        }
        Ok(digest)
    }
}

/// Terms each gradient element sums over in this micro-batch: its samples, times their
/// positions for sequences.
fn batch_rows(batch: &data::Batch) -> usize {
    let size = batch.x.size();
    size.first().copied().unwrap_or(1) as usize
        * if size.len() == 2 && batch.y.is_some() { size[1] as usize } else { 1 }
}
