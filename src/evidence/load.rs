//! Reading a trace file by the schema's tables, so a corrupt file is refused, never
//! half-compared: every tensor's name, dtype and shape, then that each per-step series
//! covers every step, and the header typed.

use std::collections::BTreeMap;
use std::path::Path;

use tch::{Kind, Tensor};

use super::header::TraceHeader;
use super::schema::{self, Kind as K};
use super::trace::{Params, RangePrediction, RankDrift, RankHeld, ScalerRecord, StepFacts, Trace};
use crate::error::{Error, Result};

const FIX: &str =
    "point to a trace written by ddp-verify --save-trace, the ddp_verify_trace recorder or fixtures/make_golden.sh";

impl Trace {
    /// Reads a trace and checks it against the schema.
    pub fn load(path: &Path) -> Result<Self> {
        if !path.is_file() {
            return Err(Error::bad_file(path, crate::error::what_is(path), FIX));
        }
        let tensors = Tensor::read_safetensors(path)
            .map_err(|e| Error::bad_file(path, format!("not a readable safetensors file ({e})"), FIX))?;
        let raw = read_meta(path).map_err(|problem| Error::bad_file(path, problem, FIX))?;
        let header = TraceHeader::parse(&raw).map_err(|p| {
            Error::bad_file(path, p.to_string(), "record it again with this version's ddp_verify_trace or ddp-verify")
        })?;
        let float = tensors.iter().find(|(n, _)| n.starts_with("final.")).map_or("F32", |(_, t)| dtype_name(t.kind()));
        let mut read = Reading::default();
        for (name, t) in tensors {
            let n = schema::parse_name(&name).map_err(|problem| Error::bad_file(path, problem, FIX))?;
            let (dtype, numel, dims) = (dtype_name(t.kind()), t.numel(), t.dim());
            n.kind
                .check(&name, dtype, numel, dims, float)
                .and_then(|()| read.add(&n, &name, t))
                .map_err(|problem| Error::bad_file(path, problem, FIX))?;
        }
        read.finish(header).map_err(|problem| Error::bad_file(path, problem, FIX))
    }
}

/// Safetensors' name of a dtype.
fn dtype_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Float => "F32",
        Kind::Double => "F64",
        Kind::BFloat16 => "BF16",
        Kind::Half => "F16",
        Kind::Int64 => "I64",
        Kind::Int => "I32",
        Kind::Int16 => "I16",
        Kind::Int8 => "I8",
        Kind::Uint8 => "U8",
        Kind::Bool => "BOOL",
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
    rank_drift: Option<RankDrift>,
    /// loss_scale, found_inf, unscales, scaler_updates.
    scaler: [BTreeMap<usize, f64>; 4],
    range_parts: Option<RangePrediction>,
}

/// A tensor's elements as float64 (it has passed the schema's checks).
fn values(t: &Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(&t.to_kind(Kind::Double).flatten(0, -1)).unwrap_or_default()
}

impl Reading {
    fn add(&mut self, n: &schema::Name, name: &str, t: Tensor) -> std::result::Result<(), String> {
        let (s, p) = (n.step, n.param.to_string());
        // Read flattened: a one-element tensor may have any shape ([1], [1, 1]). Parameters'
        // tensors are kept as they are, never copied.
        let all = if n.kind.shape == schema::Shape::Param { Vec::new() } else { values(&t) };
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
            K::RankBits => {
                let bits = Vec::<i64>::try_from(&t).unwrap_or_default();
                if let Some(rank) = bits.iter().position(|b| *b != bits[0]) {
                    let drift = RankDrift { step: s, rank, tensor: RankHeld::Grad(p) };
                    let key = |d: &RankDrift| (d.step, d.tensor.to_string());
                    if self.rank_drift.as_ref().is_none_or(|d| key(&drift) < key(d)) {
                        self.rank_drift = Some(drift);
                    }
                }
            }
            K::LossScale => _ = self.scaler[0].insert(s, first()),
            K::FoundInf => _ = self.scaler[1].insert(s, first()),
            K::Unscales => _ = self.scaler[2].insert(s, first()),
            K::ScalerUpdates => _ = self.scaler[3].insert(s, first()),
            K::RangePart => {
                let parts = self.range_parts.get_or_insert_with(RangePrediction::default);
                parts.steps.push(s);
                parts.carries |= first() != 0.0;
            }
        }
        Ok(())
    }

    /// The trace, once every series is checked to cover the steps it must.
    fn finish(self, header: TraceHeader) -> std::result::Result<Trace, String> {
        if self.finals.is_empty() {
            return Err("no final.<param> tensors".into());
        }
        // Magnitudes scale what a difference may be: a NaN or infinite one would let any
        // difference pass, so it is refused, never trusted.
        let magnitudes = self
            .peaks
            .iter()
            .map(|(n, t)| (K::Peak.name(0, n), t))
            .chain(self.scales.iter().flat_map(|(s, ps)| ps.iter().map(move |(n, t)| (K::Scale.name(*s, n), t))));
        for (name, t) in magnitudes {
            if t.numel() > 0 && t.isfinite().all().int64_value(&[]) == 0 {
                return Err(format!("{name} holds NaN or Inf; magnitudes must be finite"));
            }
        }
        let n = self.steps.len();
        if let Some(i) = (0..n).find(|i| !self.steps.contains_key(i)) {
            return Err(format!("step {i} is missing"));
        }
        if let Some(s) = self.scales.keys().find(|s| !self.steps.contains_key(s)) {
            return Err(format!("scale.{s}.* has no grads.{s}.* beside it"));
        }
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
            rank_drift: self.rank_drift,
            dropout_keys: Vec::new(),
            scaler,
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
            steps: self.steps.into_values().map(sorted).collect(),
            scales: self.scales.into_values().map(sorted).collect(),
            finals: sorted(self.finals),
            peaks: sorted(self.peaks),
            buffers: sorted(self.buffers),
            facts,
            ..Trace::default()
        };
        trace.allowances.range_parts = range_parts;
        Ok(trace)
    }
}

/// A per-step series, when present, holds exactly steps 0..n.
fn covers<T>(name: &str, series: &BTreeMap<usize, T>, n: usize) -> std::result::Result<(), String> {
    if series.is_empty() || (series.len() == n && series.keys().enumerate().all(|(i, k)| i == *k)) {
        return Ok(());
    }
    Err(format!("{name} covers {} of {n} steps", series.len()))
}

/// The safetensors header's `__metadata__` (string to string), empty when absent.
fn read_meta(path: &Path) -> std::result::Result<BTreeMap<String, String>, String> {
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
        None => Ok(BTreeMap::new()),
        Some(m) => serde_json::from_value(m.clone()).map_err(|e| format!("__metadata__ is not string to string ({e})")),
    }
}
