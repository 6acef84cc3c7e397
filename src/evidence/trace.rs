//! What one run emits: the gradient each optimizer step used, the final weights and the
//! final BatchNorm buffers. On disk: safetensors with tensors `grads.<step>.<param>`,
//! `final.<param>` and `buffer.<name>` (float32 or float64; int64 counters), the same layout
//! the PyTorch scripts in `fixtures/` and the `ddp_verify_trace` recorder (`python/`) write.
//! Optional: `peak.<param>` (each weight's largest magnitude), `scale.<step>.<param>` (the
//! sum of the micro-batch gradients' magnitudes) and a string header (`__metadata__`).

use std::collections::BTreeMap;

use std::path::Path;

use tch::{Kind, Tensor};

use crate::error::{Error, Result};

/// Named tensors sorted by name.
pub type Params = Vec<(String, Tensor)>;

/// A trace file's string header (`__metadata__`): who wrote it, W, K, dtype, ...
pub type TraceMeta = BTreeMap<String, String>;

/// The first tensor a DDP rank held differently from rank 0 after a step
/// (`dist::fingerprint`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RankDrift {
    pub step: usize,
    pub rank: usize,
    /// `param <name>`, `grad <name>`, or an optimizer state tensor (`exp_avg.<name>`).
    pub tensor: String,
}

#[derive(Debug, Default)]
pub struct Trace {
    /// `steps[s]`: the gradients optimizer step `s` (counted from 0) applied.
    pub steps: Vec<Params>,
    pub finals: Params,
    /// BatchNorm running statistics and counters at the end (empty for the linear model).
    pub buffers: Params,
    /// Largest magnitude each weight took during training (initial and after every step).
    /// SGD rounds a weight at that scale, so final weights are compared there. Empty for
    /// PyTorch's golden traces, which do not record it.
    pub peaks: Params,
    /// The accumulation run's: what rounding alone may make DDP's gradients differ by, per
    /// step and element (`train::Bounds`); empty for other traces.
    pub allowed: Vec<Params>,
    /// Likewise for the final weights.
    pub allowed_finals: Params,
    /// The accumulation run's: what rounding may make the big batch's gradients differ by.
    pub allowed_big: Vec<Params>,
    /// Likewise for the big batch's final weights and moments, under AdamW (whose updates
    /// amplify a gradient's rounding where it is noise); empty otherwise.
    pub allowed_finals_big: Params,
    /// Per step and element, the sum of |micro-batch gradient| that made the step's gradient
    /// (recorded by `ddp_verify_trace`): rounding is relative to it where terms cancel.
    pub scales: Vec<Params>,
    /// The learning rate each step applied (`lr.<step>`, float64), when recorded: a run
    /// that applies another one at some step is not the same training.
    pub lrs: Vec<f64>,
    /// How many times each step clipped its gradients (`clips.<step>`, int64), when
    /// recorded: once per step is right, once per micro-batch clips partial sums.
    pub clips: Vec<i64>,
    /// A DDP rank's: the first step at which some rank held another model than rank 0 (ours),
    /// or another gradient (the recorder's `rank_bits.<step>.<param>`: DDP all-reduces into
    /// identical gradients on every rank, so a difference is a gradient not synchronised).
    pub rank_drift: Option<RankDrift>,
    /// The recorder's: backward passes this rank made per step (`micro.<step>`, K/W in DDP).
    pub micro: Vec<i64>,
    /// The recorder's, under DDP: per step, whether each DistributedDataParallel forward's
    /// backward was to be all-reduced (`ddp_sync.<step>`; DDP decides at the end of the
    /// forward from require_backward_grad_sync). Empty where no DDP forward was seen.
    pub ddp_sync: Vec<Vec<bool>>,
    /// The recorder's: per step, the last clip's (total norm before clipping, max_norm),
    /// where clip_grad_norm_ ran (`clip.<step>`).
    pub clip_norms: Vec<Option<(f64, f64)>>,
    /// tiny-lm with dropout, ours: per step, a digest of the keys its masks were drawn from
    /// (`plan::dropout::digest`; all ranks' summed in DDP). Runs that key masks alike agree.
    pub dropout_keys: Vec<f64>,
    /// Under `--amp float16`: the loss scaler's record, per step.
    pub scaler: ScalerRecord,
    /// The accumulation run's, under `--amp float16`: where float16's range parts the runs.
    pub range_parts: Option<RangePrediction>,
    /// The file's header, when it has one.
    pub meta: TraceMeta,
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
    const PREFIX: &'static str = "range_part.";

    pub fn tensors(&self) -> Vec<(String, Tensor)> {
        let mark = f32::from(u8::from(self.carries));
        self.steps.iter().map(|s| (format!("{}{s}", Self::PREFIX), Tensor::from_slice(&[mark]))).collect()
    }
}

/// What a GradScaler did at each optimizer step: the scale the step's losses were multiplied
/// by (`loss_scale.<step>`, float32), whether it found inf/NaN and skipped the step
/// (`found_inf.<step>`, float32 0 or 1), and, in our own runs, how many times the step unscaled
/// the gradients and updated the scale (`unscales.<step>`, `scaler_updates.<step>`, int64):
/// once each is right. All compared exactly; empty without a scaler.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ScalerRecord {
    pub scales: Vec<f64>,
    pub found_inf: Vec<bool>,
    pub unscales: Vec<i64>,
    pub updates: Vec<i64>,
}

impl ScalerRecord {
    /// The per-step series, by file name prefix.
    const PREFIXES: [&'static str; 4] = ["loss_scale.", "found_inf.", "unscales.", "scaler_updates."];

    /// Reads one `<prefix><step>` scalar into its series; false when `name` is none of them.
    fn read(series: &mut [BTreeMap<usize, f64>; 4], name: &str, t: &Tensor) -> std::result::Result<bool, String> {
        let Some((i, step)) = Self::PREFIXES.iter().enumerate().find_map(|(i, p)| name.strip_prefix(p).map(|s| (i, s)))
        else {
            return Ok(false);
        };
        let step: usize = step.parse().map_err(|_| format!("tensor {name} has no step number"))?;
        let v = (t.numel() == 1).then(|| t.to_kind(Kind::Double).flatten(0, -1).double_value(&[0]));
        let v = v.filter(|v| v.is_finite()).ok_or_else(|| format!("tensor {name} is not one finite number"))?;
        series[i].insert(step, v);
        Ok(true)
    }

    fn from_series(series: [BTreeMap<usize, f64>; 4], steps: usize) -> std::result::Result<Self, String> {
        for (prefix, s) in Self::PREFIXES.iter().zip(&series) {
            if !s.is_empty() && (s.len() != steps || s.keys().enumerate().any(|(i, k)| i != *k)) {
                return Err(format!("{prefix}<step> covers {} of {steps} steps", s.len()));
            }
        }
        let [scales, found, unscales, updates] = series.map(|s| s.into_values().collect::<Vec<f64>>());
        Ok(ScalerRecord {
            scales,
            found_inf: found.iter().map(|&f| f != 0.0).collect(),
            unscales: unscales.iter().map(|&n| n as i64).collect(),
            updates: updates.iter().map(|&n| n as i64).collect(),
        })
    }

    /// Each recorded series as `(prefix, step, tensor)` for a trace file.
    pub fn tensors(&self) -> Vec<(String, Tensor)> {
        let f32s = |v: f64| Tensor::from_slice(&[v as f32]);
        let steps = |prefix: &str, values: Vec<Tensor>| -> Vec<(String, Tensor)> {
            values.into_iter().enumerate().map(|(s, t)| (format!("{prefix}{s}"), t)).collect()
        };
        let mut out = steps(Self::PREFIXES[0], self.scales.iter().map(|&v| f32s(v)).collect());
        out.extend(steps(Self::PREFIXES[1], self.found_inf.iter().map(|&f| f32s(f64::from(u8::from(f)))).collect()));
        out.extend(steps(Self::PREFIXES[2], self.unscales.iter().map(|&n| Tensor::from_slice(&[n])).collect()));
        out.extend(steps(Self::PREFIXES[3], self.updates.iter().map(|&n| Tensor::from_slice(&[n])).collect()));
        out
    }
}

impl Trace {
    /// Reads a trace and checks its layout, so a corrupt file is refused, never half-compared.
    pub fn load(path: &Path) -> Result<Self> {
        let fix = "point to a trace written by ddp-verify --save-trace, the ddp_verify_trace recorder or \
                   fixtures/make_golden.sh";
        if !path.is_file() {
            return Err(Error::bad_file(path, crate::error::what_is(path), fix));
        }
        let tensors = Tensor::read_safetensors(path)
            .map_err(|e| Error::bad_file(path, format!("not a readable safetensors file ({e})"), fix))?;
        let meta = read_meta(path).map_err(|problem| Error::bad_file(path, problem, fix))?;
        let mut steps: BTreeMap<usize, Params> = BTreeMap::new();
        let mut scales: BTreeMap<usize, Params> = BTreeMap::new();
        let mut finals = Params::new();
        let mut peaks = Params::new();
        let mut buffers = Params::new();
        let float = tensors.iter().find(|(n, _)| n.starts_with("final.")).map_or(Kind::Float, |(_, t)| t.kind());
        let mut lrs: BTreeMap<usize, f64> = BTreeMap::new();
        let mut clips: BTreeMap<usize, i64> = BTreeMap::new();
        let mut micro: BTreeMap<usize, i64> = BTreeMap::new();
        let mut ddp_sync: BTreeMap<usize, Vec<bool>> = BTreeMap::new();
        let mut clip_norms: BTreeMap<usize, (f64, f64)> = BTreeMap::new();
        let mut rank_drift: Option<RankDrift> = None;
        let mut scaler: [BTreeMap<usize, f64>; 4] = Default::default();
        let mut range_parts: Option<RangePrediction> = None;
        for (name, t) in tensors {
            if let Some(step) = name.strip_prefix(RangePrediction::PREFIX) {
                let step = step.parse::<usize>().ok().filter(|_| t.numel() == 1);
                let step =
                    step.ok_or_else(|| Error::bad_file(path, format!("tensor {name} is not one step's mark"), fix))?;
                let parts = range_parts.get_or_insert_with(RangePrediction::default);
                parts.steps.push(step);
                parts.carries |= t.to_kind(Kind::Double).flatten(0, -1).double_value(&[0]) != 0.0;
                continue;
            }
            if ScalerRecord::read(&mut scaler, &name, &t).map_err(|problem| Error::bad_file(path, problem, fix))? {
                continue;
            }
            if let Some(b) = name.strip_prefix("buffer.") {
                buffers.push((b.to_string(), t));
                continue;
            }
            for (prefix, into) in [("clips.", &mut clips), ("micro.", &mut micro)] {
                if let Some(step) = name.strip_prefix(prefix) {
                    let n = step
                        .parse::<usize>()
                        .ok()
                        .zip((t.numel() == 1 && t.kind() == Kind::Int64).then(|| t.int64_value(&[0])));
                    let (step, n) = n.ok_or_else(|| {
                        Error::bad_file(path, format!("tensor {name} is not one int64 count of a numbered step"), fix)
                    })?;
                    into.insert(step, n);
                }
            }
            if name.starts_with("clips.") || name.starts_with("micro.") {
                continue;
            }
            if let Some(step) = name.strip_prefix("ddp_sync.") {
                let step = step.parse::<usize>().ok().filter(|_| t.kind() == Kind::Int64 && t.dim() == 1);
                let step = step.ok_or_else(|| {
                    Error::bad_file(path, format!("tensor {name} is not a step's int64 flag per DDP forward"), fix)
                })?;
                ddp_sync.insert(step, Vec::<i64>::try_from(&t).unwrap_or_default().iter().map(|&f| f != 0).collect());
                continue;
            }
            if let Some(step) = name.strip_prefix("clip.") {
                let v = (t.numel() == 2 && t.kind() == Kind::Double)
                    .then(|| (t.double_value(&[0]), t.double_value(&[1])))
                    .zip(step.parse::<usize>().ok());
                let ((total, max), step) = v.ok_or_else(|| {
                    Error::bad_file(path, format!("tensor {name} is not a step's float64 [total norm, max norm]"), fix)
                })?;
                clip_norms.insert(step, (total, max));
                continue;
            }
            if let Some(rest) = name.strip_prefix("rank_bits.") {
                let parsed = rest.split_once('.').and_then(|(s, p)| Some((s.parse::<usize>().ok()?, p)));
                let ((step, param), true) = (
                    parsed.ok_or_else(|| Error::bad_file(path, format!("tensor {name} has no step number"), fix))?,
                    t.kind() == Kind::Int64 && t.dim() == 1,
                ) else {
                    return Err(Error::bad_file(
                        path,
                        format!("tensor {name} is not one int64 checksum per rank"),
                        fix,
                    ));
                };
                let bits = Vec::<i64>::try_from(&t).unwrap_or_default();
                if let Some(rank) = bits.iter().position(|b| *b != bits[0]) {
                    let drift = RankDrift { step, rank, tensor: format!("grad {param}") };
                    if rank_drift.as_ref().is_none_or(|d| (step, &drift.tensor) < (d.step, &d.tensor)) {
                        rank_drift = Some(drift);
                    }
                }
                continue;
            }
            if let Some(step) = name.strip_prefix("lr.") {
                let step: usize = step
                    .parse()
                    .map_err(|_| Error::bad_file(path, format!("tensor {name} has no step number"), fix))?;
                // One per param group (the recorder's); the first group's is compared.
                let lr = (t.numel() >= 1).then(|| t.to_kind(Kind::Double).flatten(0, -1).double_value(&[0]));
                let lr = lr.filter(|v| v.is_finite()).ok_or_else(|| {
                    Error::bad_file(path, format!("tensor {name} is not a finite learning rate per param group"), fix)
                })?;
                lrs.insert(step, lr);
                continue;
            }
            if t.kind() != float || !matches!(float, Kind::Float | Kind::Double | Kind::BFloat16 | Kind::Half) {
                let problem = format!("tensor {name} is {:?}, expected one floating dtype like the rest", t.kind());
                return Err(Error::bad_file(path, problem, fix));
            }
            let stepped = |prefix: &str| name.strip_prefix(prefix).and_then(|r| r.split_once('.'));
            if let Some(p) = name.strip_prefix("final.") {
                finals.push((p.to_string(), t));
            } else if let Some(p) = name.strip_prefix("peak.") {
                peaks.push((p.to_string(), t));
            } else if let Some((step, p)) = stepped("grads.").or_else(|| stepped("scale.")) {
                let step: usize = step
                    .parse()
                    .map_err(|_| Error::bad_file(path, format!("tensor {name} has no step number"), fix))?;
                let into = if name.starts_with("grads.") { &mut steps } else { &mut scales };
                into.entry(step).or_default().push((p.to_string(), t));
            } else {
                return Err(Error::bad_file(path, format!("unexpected tensor {name}"), fix));
            }
        }
        if finals.is_empty() {
            return Err(Error::bad_file(path, "no final.<param> tensors", fix));
        }
        // Magnitudes scale what a difference may be: a NaN or infinite one would let any
        // difference pass, so it is refused, never trusted.
        let magnitudes = peaks
            .iter()
            .map(|p| ("peak", 0, p))
            .chain(scales.iter().flat_map(|(s, ps)| ps.iter().map(move |p| ("scale", *s, p))));
        for (prefix, step, (name, t)) in magnitudes {
            if t.numel() > 0 && t.isfinite().all().int64_value(&[]) == 0 {
                let name = if prefix == "peak" { format!("peak.{name}") } else { format!("scale.{step}.{name}") };
                return Err(Error::bad_file(path, format!("{name} holds NaN or Inf; magnitudes must be finite"), fix));
            }
        }
        if let Some(s) = scales.keys().find(|s| !steps.contains_key(s)) {
            return Err(Error::bad_file(path, format!("scale.{s}.* has no grads.{s}.* beside it"), fix));
        }
        if !scales.is_empty() && scales.len() != steps.len() {
            let problem = format!("scale.<step>.* covers {} of {} steps", scales.len(), steps.len());
            return Err(Error::bad_file(path, problem, fix));
        }
        if !lrs.is_empty() && (lrs.len() != steps.len() || lrs.keys().zip(steps.keys()).any(|(a, b)| a != b)) {
            let problem = format!("lr.<step> covers {} of {} steps", lrs.len(), steps.len());
            return Err(Error::bad_file(path, problem, fix));
        }
        if !clips.is_empty() && clips.len() != steps.len() {
            let problem = format!("clips.<step> covers {} of {} steps", clips.len(), steps.len());
            return Err(Error::bad_file(path, problem, fix));
        }
        let scaler =
            ScalerRecord::from_series(scaler, steps.len()).map_err(|problem| Error::bad_file(path, problem, fix))?;
        let (lrs, clips) = (lrs.into_values().collect(), clips.into_values().collect());
        let micro = micro.into_values().collect();
        let clip_norms = (0..steps.len()).map(|s| clip_norms.get(&s).copied()).collect();
        let ddp_sync = if ddp_sync.is_empty() {
            Vec::new()
        } else {
            (0..steps.len()).map(|s| ddp_sync.remove(&s).unwrap_or_default()).collect()
        };
        if let Some(p) = range_parts.as_mut() {
            p.steps.sort_unstable();
        }
        let mut trace = Trace {
            finals,
            buffers,
            peaks,
            meta,
            lrs,
            clips,
            micro,
            ddp_sync,
            clip_norms,
            rank_drift,
            scaler,
            range_parts,
            ..Trace::default()
        };
        for (i, (s, mut grads)) in steps.into_iter().enumerate() {
            if s != i {
                return Err(Error::bad_file(path, format!("step {i} is missing"), fix));
            }
            grads.sort_by(|a, b| a.0.cmp(&b.0));
            trace.steps.push(grads);
        }
        for (_, mut scale) in scales {
            scale.sort_by(|a, b| a.0.cmp(&b.0));
            trace.scales.push(scale);
        }
        trace.finals.sort_by(|a, b| a.0.cmp(&b.0));
        trace.peaks.sort_by(|a, b| a.0.cmp(&b.0));
        trace.buffers.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(trace)
    }
}

/// The safetensors header's `__metadata__` (string to string), empty when absent.
fn read_meta(path: &Path) -> std::result::Result<TraceMeta, String> {
    use std::io::Read;
    let mut file = std::fs::File::open(path).map_err(|e| format!("cannot be read ({e})"))?;
    let mut len = [0u8; 8];
    file.read_exact(&mut len).map_err(|e| format!("no safetensors header ({e})"))?;
    let len = u64::from_le_bytes(len);
    let size = file.metadata().map_or(0, |m| m.len());
    if len > size.saturating_sub(8) {
        return Err(format!("its header claims {len} bytes but the file has {size}"));
    }
    let mut header = vec![0u8; len as usize];
    file.read_exact(&mut header).map_err(|e| format!("truncated safetensors header ({e})"))?;
    let header: serde_json::Value =
        serde_json::from_slice(&header).map_err(|e| format!("unreadable safetensors header ({e})"))?;
    match header.get("__metadata__") {
        None => Ok(TraceMeta::new()),
        Some(m) => serde_json::from_value(m.clone()).map_err(|e| format!("__metadata__ is not string to string ({e})")),
    }
}

impl Trace {
    /// The accumulation run's trace as the big batch is judged against it: the big batch's
    /// allowances in place of DDP's (under SGD none for the finals, which keep the fixed
    /// tolerance at their peaks; AdamW carries one).
    pub fn for_big_batch(self) -> Trace {
        Trace {
            allowed: self.allowed_big,
            allowed_big: Vec::new(),
            allowed_finals: self.allowed_finals_big,
            allowed_finals_big: Params::new(),
            ..self
        }
    }

    /// The same finals, buffers and peaks (shared, not copied), without the steps.
    pub fn without_steps(&self) -> Trace {
        let share = |p: &Params| p.iter().map(|(n, t)| (n.clone(), t.shallow_clone())).collect();
        Trace {
            steps: Vec::new(),
            finals: share(&self.finals),
            buffers: share(&self.buffers),
            peaks: share(&self.peaks),
            allowed: Vec::new(),
            allowed_finals: share(&self.allowed_finals),
            allowed_big: Vec::new(),
            allowed_finals_big: share(&self.allowed_finals_big),
            scales: Vec::new(),
            lrs: self.lrs.clone(),
            clips: self.clips.clone(),
            rank_drift: self.rank_drift.clone(),
            micro: self.micro.clone(),
            ddp_sync: self.ddp_sync.clone(),
            clip_norms: self.clip_norms.clone(),
            dropout_keys: self.dropout_keys.clone(),
            scaler: self.scaler.clone(),
            range_parts: self.range_parts.clone(),
            meta: self.meta.clone(),
        }
    }
}

/// A detached copy of named tensors (parameters or their gradients).
pub fn snapshot<'a>(named: impl IntoIterator<Item = (&'a String, Tensor)>) -> Params {
    // Comparisons happen on the CPU; a GPU tensor's move to the CPU is its copy.
    let host = |t: Tensor| {
        if t.device() == tch::Device::Cpu {
            t.detach().copy()
        } else {
            t.detach().to_device(tch::Device::Cpu)
        }
    };
    named.into_iter().map(|(n, t)| (n.clone(), host(t))).collect()
}

/// At most `k` elements of `t`, flattened, at evenly strided positions `i * numel / k`
/// (the same positions `fixtures/resnet_reference.py` keeps). Tensors of `k` elements or
/// fewer are kept whole, so sampling twice changes nothing.
pub fn sample(t: &Tensor, k: usize) -> Tensor {
    let flat = t.flatten(0, -1);
    let n = flat.numel();
    if n <= k {
        return flat;
    }
    let idx: Vec<i64> = (0..k).map(|i| (i * n / k) as i64).collect();
    flat.index_select(0, &Tensor::from_slice(&idx))
}
