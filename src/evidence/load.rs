//! Reading a trace file by the schema's tables, so a corrupt file is refused, never
//! half-compared: every tensor's name, dtype and shape, then that each per-step series
//! covers every step, and the header typed.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use memmap2::Mmap;

use safetensors::tensor::{Metadata, TensorInfo};
use safetensors::Dtype as St;

use super::header::TraceHeader;
use super::sampled::{Sampled, Sampling, Summaries, Summary};
use super::schema::{self, Kind as K};
use super::trace::{Params, RangePrediction, RankDrift, RankHeld, ScalerRecord, StepFacts, Trace};
use super::values::{Data, Elem, Values};
use crate::error::{Error, Result};

const FIX: &str =
    "point to a trace written by ddp-verify --save-trace, the ddp_verify_trace recorder or fixtures/make_golden.sh";

impl Trace {
    /// Reads a trace and checks it against the schema. Parameters' tensors (gradients,
    /// weights, magnitudes) stay in the mapped file, read as they are judged; the small ones
    /// are read into memory.
    pub fn load(path: &Path) -> Result<Self> {
        if !path.is_file() {
            return Err(Error::bad_file(path, crate::error::what_is(path), FIX));
        }
        let bad = |problem: String| Error::bad_file(path, problem, FIX);
        let file = File::open(path).map_err(|e| bad(format!("cannot be read ({e})")))?;
        let (meta, base) = read_index(&file).map_err(|e| bad(format!("not a readable safetensors file ({e})")))?;
        let raw: BTreeMap<String, String> = meta.metadata().clone().unwrap_or_default().into_iter().collect();
        let header = TraceHeader::parse(&raw).map_err(|p| {
            Error::bad_file(path, p.to_string(), "record it again with this version's ddp_verify_trace or ddp-verify")
        })?;
        // SAFETY: mapped read-only and private; a trace is not written while it is judged
        // (a file changed underneath would give wrong numbers, not unsafety in Rust's sense
        // beyond what reading it would).
        let map = unsafe { Mmap::map(&file) }.map_err(|e| bad(format!("cannot be mapped ({e})")))?;
        let map = Arc::new(map);
        let names = meta.offset_keys();
        let info = |name: &str| meta.info(name).expect("offset_keys names indexed tensors");
        let float = names.iter().find(|n| n.starts_with("final.")).map_or("F32", |n| dtype_name(info(n).dtype));
        let mut read = Reading::default();
        for name in &names {
            let i = info(name);
            let n = schema::parse_name(name).map_err(bad)?;
            let numel = i.shape.iter().product::<usize>();
            n.kind.check(name, dtype_name(i.dtype), numel, i.shape.len(), float).map_err(bad)?;
            let t = match (n.kind.shape == schema::Shape::Param, elem(i.dtype)) {
                (true, Some(e)) => {
                    let (start, end) = i.data_offsets;
                    Values::mapped(map.clone(), base as usize + start, end - start, e, i.shape.clone())
                }
                _ => read_tensor(&map[base as usize..], i).map_err(|e| bad(format!("cannot read {name} ({e})")))?,
            };
            read.add(&n, name, t).map_err(bad)?;
        }
        read.finish(header).map_err(bad)
    }
}

/// The safetensors header (validated by the `safetensors` crate: offsets contiguous, sizes
/// matching shapes) and where the data starts; the file must end where the data does.
fn read_index(file: &File) -> std::result::Result<(Metadata, u64), String> {
    let size = file.metadata().map_err(|e| e.to_string())?.len();
    let mut len = [0u8; 8];
    file.read_exact_at(&mut len, 0).map_err(|_| "no safetensors header".to_string())?;
    let len = u64::from_le_bytes(len);
    if len > size.saturating_sub(8) {
        return Err(format!("its header claims {len} bytes but the file has {size}"));
    }
    let mut header = vec![0u8; len as usize];
    file.read_exact_at(&mut header, 8).map_err(|e| format!("truncated header: {e}"))?;
    let meta: Metadata = serde_json::from_slice(&header).map_err(|e| format!("unreadable header: {e}"))?;
    let data = meta.tensors().values().map(|t| t.data_offsets.1 as u64).max().unwrap_or(0);
    // A header may claim offsets near u64::MAX: the sum saturates rather than overflows.
    let end = (8 + len).saturating_add(data);
    if end != size {
        return Err(format!("its tensors end at byte {end} but the file has {size}"));
    }
    Ok((meta, 8 + len))
}

/// The dtypes a trace holds as they are.
fn elem(d: St) -> Option<Elem> {
    match d {
        St::F32 => Some(Elem::F32),
        St::F64 => Some(Elem::F64),
        St::BF16 => Some(Elem::Bf16),
        St::F16 => Some(Elem::F16),
        St::I64 => Some(Elem::I64),
        _ => None,
    }
}

/// One tensor's elements from the file's data: floats and int64 as they are, smaller
/// integers and bools as int64.
fn read_tensor(data: &[u8], info: &TensorInfo) -> std::io::Result<Values> {
    let (start, end) = info.data_offsets;
    let bytes = &data[start..end];
    let shape = info.shape.clone();
    let elem = match elem(info.dtype) {
        Some(e) => e,
        None => {
            let other = info.dtype;
            let ints: Vec<i64> = match other {
                St::I32 => {
                    bytes.chunks_exact(4).map(|c| i64::from(i32::from_le_bytes(c.try_into().unwrap()))).collect()
                }
                St::I16 => {
                    bytes.chunks_exact(2).map(|c| i64::from(i16::from_le_bytes(c.try_into().unwrap()))).collect()
                }
                St::I8 => bytes.iter().map(|b| i64::from(*b as i8)).collect(),
                St::U8 | St::BOOL => bytes.iter().map(|b| i64::from(*b)).collect(),
                _ => return Err(std::io::Error::other(format!("dtype {other:?} is not one a trace holds"))),
            };
            return Ok(Values::new(shape, Data::I64(ints)));
        }
    };
    Ok(Values::from_le_bytes(elem, shape, bytes))
}

/// Safetensors' name of a dtype.
fn dtype_name(d: St) -> &'static str {
    match d {
        St::F32 => "F32",
        St::F64 => "F64",
        St::BF16 => "BF16",
        St::F16 => "F16",
        St::I64 => "I64",
        St::I32 => "I32",
        St::I16 => "I16",
        St::I8 => "I8",
        St::U8 => "U8",
        St::BOOL => "BOOL",
        _ => "other",
    }
}

/// The tensors read so far, by kind and step.
#[derive(Default)]
struct Reading {
    steps: BTreeMap<usize, Params>,
    scales: BTreeMap<usize, Params>,
    finals: Params,
    peaks: Params,
    buffers: Params,
    lrs: BTreeMap<usize, f64>,
    clips: BTreeMap<usize, i64>,
    micro: BTreeMap<usize, i64>,
    clip_norms: BTreeMap<usize, (f64, f64)>,
    ddp_sync: BTreeMap<usize, Vec<bool>>,
    comm: BTreeMap<usize, (i64, i64)>,
    seconds: BTreeMap<usize, f64>,
    rank_drift: Option<RankDrift>,
    /// loss_scale, found_inf, unscales, scaler_updates.
    scaler: [BTreeMap<usize, f64>; 4],
    range_parts: Option<RangePrediction>,
    positions: BTreeMap<String, Vec<i64>>,
    shapes: BTreeMap<String, Vec<i64>>,
    summaries: BTreeMap<usize, Summaries>,
    final_summaries: Summaries,
    stages: BTreeMap<usize, super::StageStep>,
    /// `samples.<s>` as read: put beside the step's batches once both are (`finish`).
    samples: BTreeMap<usize, Vec<f64>>,
    /// `autocast.<s>` as read: each micro-batch's, put into the step's batches (`finish`).
    autocast: BTreeMap<usize, Vec<f64>>,
    groups: BTreeMap<usize, Vec<super::Group>>,
    /// Per parameter, whether the ranks' final weights differ, and the first rank apart.
    rank_finals: BTreeMap<String, usize>,
}

/// The first rank whose checksum is not rank 0's.
fn apart(bits: &[i64]) -> Option<usize> {
    bits.iter().position(|b| *b != bits[0])
}

impl Reading {
    /// Keeps the earliest drift: by step, then a gradient before a weight.
    fn drift(&mut self, drift: RankDrift) {
        let key = |d: &RankDrift| (d.step, d.tensor.to_string());
        if self.rank_drift.as_ref().is_none_or(|d| key(&drift) < key(d)) {
            self.rank_drift = Some(drift);
        }
    }

    fn add(&mut self, n: &schema::Name, name: &str, t: Values) -> std::result::Result<(), String> {
        let (s, p) = (n.step, n.param.to_string());
        // Read flattened: a one-element tensor may have any shape ([1], [1, 1]). Parameters'
        // tensors are kept as they are, never copied.
        let all = if n.kind.shape == schema::Shape::Param { Vec::new() } else { t.to_f64() };
        let first = || all.first().copied().unwrap_or(0.0);
        let second = || all.get(1).copied().unwrap_or(0.0);
        if n.kind.elements == schema::Elements::Finite && all.iter().any(|v| !v.is_finite()) {
            return Err(format!("tensor {name} is not finite: {}", n.kind.about));
        }
        match n.kind.kind {
            K::Grads => self.steps.entry(s).or_default().push((p, t)),
            K::Scale => self.scales.entry(s).or_default().push((p, t)),
            K::Final => self.finals.push((p, t)),
            K::Peak => self.peaks.push((p, t)),
            K::Buffer => self.buffers.push((p, t)),
            // One per param group; the first group's is compared.
            K::Lr => _ = self.lrs.insert(s, first()),
            K::Micro => _ = self.micro.insert(s, first() as i64),
            K::Clips => _ = self.clips.insert(s, first() as i64),
            K::Clip => _ = self.clip_norms.insert(s, (first(), second())),
            K::DdpSync => _ = self.ddp_sync.insert(s, all.iter().map(|&f| f != 0.0).collect()),
            K::Comm => _ = self.comm.insert(s, (first() as i64, second() as i64)),
            K::Seconds => _ = self.seconds.insert(s, first()),
            K::RankBits => {
                if let Some(rank) = apart(&t.to_i64()) {
                    self.drift(RankDrift { step: s, rank, tensor: RankHeld::Grad(p) });
                }
            }
            // Weights as step s found them: step s - 1's update parted them (a gradient
            // apart at that step is the earlier fact, and sorts first).
            K::RankWeights => {
                if let Some(rank) = apart(&t.to_i64()) {
                    self.drift(RankDrift { step: s.saturating_sub(1), rank, tensor: RankHeld::Param(p) });
                }
            }
            K::RankFinal => {
                if let Some(rank) = apart(&t.to_i64()) {
                    self.rank_finals.insert(p, rank);
                }
            }
            K::Groups => {
                let rows = super::groups::rows(&all).ok_or_else(|| format!("tensor {name}: {}", n.kind.about))?;
                self.groups.insert(s, rows);
            }
            K::LossScale => _ = self.scaler[0].insert(s, first()),
            K::FoundInf => _ = self.scaler[1].insert(s, first()),
            K::Unscales => _ = self.scaler[2].insert(s, first()),
            K::ScalerUpdates => _ = self.scaler[3].insert(s, first()),
            K::Positions => _ = self.positions.insert(p, t.to_i64()),
            K::ParamShape => _ = self.shapes.insert(p, t.to_i64()),
            K::Summary => _ = self.summaries.entry(s).or_default().insert(p, Summary::from_values(&t)),
            K::FinalSummary => _ = self.final_summaries.insert(p, Summary::from_values(&t)),
            K::Batches => {
                let rows = super::stages::rows(&all).ok_or_else(|| format!("tensor {name}: {}", n.kind.about))?;
                self.stages.entry(s).or_default().batches = rows;
            }
            K::Samples => _ = self.samples.insert(s, all.clone()),
            K::Autocast => _ = self.autocast.insert(s, all.clone()),
            K::Local => _ = self.stages.entry(s).or_default().local.insert(p, first()),
            K::StepCalls => self.stages.entry(s).or_default().step_calls = Some(first() as i64),
            K::Zeroed => self.stages.entry(s).or_default().zeroed = first() as i64,
            K::RangePart => {
                let parts = self.range_parts.get_or_insert_with(RangePrediction::default);
                parts.steps.push(s);
                parts.carries |= first() != 0.0;
            }
        }
        Ok(())
    }

    /// The trace, once every series is checked to cover the steps it must.
    fn finish(mut self, header: TraceHeader) -> std::result::Result<Trace, String> {
        if self.finals.is_empty() {
            return Err("no final.<param> tensors".into());
        }
        for (s, digits) in std::mem::take(&mut self.autocast) {
            let step = self.stages.entry(s).or_default();
            if digits.len() != step.batches.len() {
                return Err(format!(
                    "tensor autocast.{s}: {} values for {} micro-batches",
                    digits.len(),
                    step.batches.len()
                ));
            }
            for (b, d) in step.batches.iter_mut().zip(digits) {
                b.autocast = (d.is_finite() && d >= 0.0).then_some(d as u32);
            }
        }
        for (s, flat) in std::mem::take(&mut self.samples) {
            let step = self.stages.entry(s).or_default();
            step.samples = super::stages::samples(&flat, &step.batches)
                .ok_or_else(|| format!("tensor samples.{s}: fewer hashes than batches.{s} counts"))?;
        }
        // A step a loss scaler skipped (found_inf) overflowed in its micro-batches'
        // gradients: their magnitudes are no scale of anything compared (its gradients are
        // not judged), kept at 0 where not finite, the least they could allow.
        for (s, ps) in self.scales.iter_mut() {
            if self.scaler[1].get(s).is_some_and(|&f| f != 0.0) {
                for (_, t) in ps.iter_mut().filter(|(_, t)| !t.all_finite()) {
                    let finite = t.to_f64().into_iter().map(|x| if x.is_finite() { x } else { 0.0 }).collect();
                    *t = Values::from_f64_as(t.elem(), t.shape(), finite);
                }
            }
        }
        // Magnitudes scale what a difference may be: a NaN or infinite one would let any
        // difference pass, so it is refused, never trusted.
        let magnitudes = self
            .peaks
            .iter()
            .map(|(n, t)| (K::Peak.name(0, n), t))
            .chain(self.scales.iter().flat_map(|(s, ps)| ps.iter().map(move |(n, t)| (K::Scale.name(*s, n), t))));
        for (name, t) in magnitudes {
            let finite = t.all_finite();
            t.release();
            if !finite {
                return Err(format!("{name} holds NaN or Inf; magnitudes must be finite"));
            }
        }
        // A step the recorder counted (micro.<s>) may hold no gradient at all: an engine that
        // never reduced one left the optimizer none (FSDP2 without a synchronised backward).
        let n = self.steps.keys().chain(self.micro.keys()).max().map_or(0, |s| s + 1);
        if let Some(i) = (0..n).find(|i| !self.steps.contains_key(i) && !self.micro.contains_key(i)) {
            return Err(format!("step {i} is missing"));
        }
        if let Some(s) = self.scales.keys().find(|s| !self.steps.contains_key(s)) {
            return Err(format!("scale.{s}.* has no grads.{s}.* beside it"));
        }
        // Final weights apart between ranks: the last step's update parted them.
        for (p, rank) in std::mem::take(&mut self.rank_finals) {
            self.drift(RankDrift { step: n.saturating_sub(1), rank, tensor: RankHeld::Param(p) });
        }
        let mut steps = std::mem::take(&mut self.steps);
        covers("scale.<step>.*", &self.scales, n)?;
        covers("lr.<step>", &self.lrs, n)?;
        covers("clips.<step>", &self.clips, n)?;
        let names = ["loss_scale.<step>", "found_inf.<step>", "unscales.<step>", "scaler_updates.<step>"];
        for (name, series) in names.iter().zip(&self.scaler) {
            covers(name, series, n)?;
        }
        let [scales, found, unscales, updates] = self.scaler.map(|s| s.into_values().collect::<Vec<f64>>());
        let scaler = ScalerRecord {
            scales,
            found_inf: found.iter().map(|&f| f != 0.0).collect(),
            unscales: unscales.iter().map(|&v| v as i64).collect(),
            updates: updates.iter().map(|&v| v as i64).collect(),
        };
        let sampling = sampling(header.sample, self.positions, self.shapes, self.summaries, self.final_summaries, n)?;
        let mut ddp_sync = self.ddp_sync;
        let facts = StepFacts {
            lrs: self.lrs.into_values().collect(),
            clips: self.clips.into_values().collect(),
            clip_norms: (0..n).map(|s| self.clip_norms.get(&s).copied()).collect(),
            micro: self.micro.into_values().collect(),
            ddp_sync: match ddp_sync.is_empty() {
                true => Vec::new(),
                false => (0..n).map(|s| ddp_sync.remove(&s).unwrap_or_default()).collect(),
            },
            comm: (0..n).map(|s| self.comm.get(&s).copied()).collect(),
            seconds: (0..n).map(|s| self.seconds.get(&s).copied()).collect(),
            rank_drift: self.rank_drift,
            groups: match self.groups.is_empty() {
                true => Vec::new(),
                false => (0..n).map(|s| self.groups.remove(&s).unwrap_or_default()).collect(),
            },
            dropout_keys: Vec::new(),
            scaler,
            stages: match self.stages.is_empty() {
                true => Vec::new(),
                false => (0..n).map(|s| self.stages.remove(&s).unwrap_or_default()).collect(),
            },
        };
        let mut range_parts = self.range_parts;
        if let Some(p) = range_parts.as_mut() {
            p.steps.sort_unstable();
        }
        let sorted = |mut p: Params| {
            p.sort_by(|a, b| a.0.cmp(&b.0));
            p
        };
        let mut trace = Trace {
            header,
            steps: (0..n).map(|s| sorted(steps.remove(&s).unwrap_or_default())).collect(),
            scales: self.scales.into_values().map(sorted).collect(),
            finals: sorted(self.finals),
            peaks: sorted(self.peaks),
            buffers: sorted(self.buffers),
            facts,
            ..Trace::default()
        };
        trace.allowances.range_parts = range_parts;
        if trace.header.recorded_by.is_some() {
            unscale(&mut trace);
        }
        if let Some(s) = sampling {
            s.check(&trace)?;
            trace.sampling = Some(s);
        }
        Ok(trace)
    }
}

/// A GradScaler multiplies each loss by its scale before backward, so the roots, the local
/// gradients and the micro-batch magnitudes the recorder took from the backwards carry it,
/// where the applied gradients do not (`unscale_` took it out). Taken out here, once, so that
/// every stage, contract and allowance reads the run as it trains: a magnitude 65536 times
/// too large would allow as much, and `watch` would read the scale as the script's own.
fn unscale(t: &mut Trace) {
    for (s, &sc) in t.facts.scaler.scales.iter().enumerate() {
        if !sc.is_finite() || sc <= 0.0 || sc == 1.0 {
            continue;
        }
        if let Some(st) = t.facts.stages.get_mut(s) {
            st.batches.iter_mut().filter_map(|b| b.root.as_mut()).for_each(|r| *r /= sc);
            st.local.values_mut().for_each(|v| *v /= sc);
        }
        for (_, v) in t.scales.get_mut(s).into_iter().flatten() {
            *v = Values::from_f64_as(v.elem(), v.shape(), v.to_f64().iter().map(|x| x / sc).collect());
        }
    }
}

/// A sampled trace's positions, shapes and summaries, each position list increasing and
/// inside its parameter; None for a whole trace (which must hold none of them).
fn sampling(
    size: Option<usize>,
    positions: BTreeMap<String, Vec<i64>>,
    mut shapes: BTreeMap<String, Vec<i64>>,
    mut summaries: BTreeMap<usize, Summaries>,
    finals: Summaries,
    steps: usize,
) -> std::result::Result<Option<Sampling>, String> {
    let Some(size) = size else {
        return match positions.keys().chain(shapes.keys()).chain(finals.keys()).next() {
            Some(n) => Err(format!("{n} is sampled but the header has no sample key")),
            None if !summaries.is_empty() => Err("summary.<step>.* without a sample key in the header".into()),
            None => Ok(None),
        };
    };
    let mut params = BTreeMap::new();
    for (name, pos) in positions {
        let shape = shapes.remove(&name).ok_or_else(|| format!("positions.{name} has no shape.{name} beside it"))?;
        let shape: Vec<usize> = shape.iter().map(|&d| usize::try_from(d).unwrap_or(usize::MAX)).collect();
        let numel = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).unwrap_or(usize::MAX);
        let increasing = pos.windows(2).all(|w| w[0] < w[1]);
        if !increasing || pos.first().is_some_and(|&p| p < 0) || pos.last().is_some_and(|&p| p as u128 >= numel as u128)
        {
            return Err(format!("positions.{name} must increase and lie inside shape.{name} ({shape:?})"));
        }
        let positions = Arc::new(pos.into_iter().map(|p| p as usize).collect());
        params.insert(name, Sampled { positions, shape });
    }
    if let Some(name) = shapes.keys().next() {
        return Err(format!("shape.{name} has no positions.{name} beside it"));
    }
    if let Some(s) = summaries.keys().find(|&&s| s >= steps) {
        return Err(format!("summary.{s}.* has no grads.{s}.* beside it"));
    }
    let steps = (0..steps).map(|s| summaries.remove(&s).unwrap_or_default()).collect();
    Ok(Some(Sampling { size, params, steps, finals }))
}

/// A per-step series, when present, holds exactly steps 0..n.
fn covers<T>(name: &str, series: &BTreeMap<usize, T>, n: usize) -> std::result::Result<(), String> {
    if series.is_empty() || (series.len() == n && series.keys().enumerate().all(|(i, k)| i == *k)) {
        return Ok(());
    }
    Err(format!("{name} covers {} of {n} steps", series.len()))
}
