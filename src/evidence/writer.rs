//! Saving a trace as safetensors, streamed step by step.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::schema::Kind as K;
use super::trace::{Params, Trace};
use super::values::Values;
use crate::error::{Error, Result};

impl Trace {
    /// Writes the whole trace at once, as [`TraceWriter`] streams it.
    pub fn save(&self, path: &Path) -> Result<()> {
        let mut w = TraceWriter::create(path)?;
        for (s, grads) in self.steps.iter().enumerate() {
            w.step(s, grads)?;
        }
        w.finish(self)
    }
}

/// Writes a trace as it is made, one step's gradients at a time, so saving never needs every
/// step in memory. Tensor bytes go to `<path>.part` as they come; `finish` writes the
/// safetensors header (which must come first and name every offset) and then copies them.
pub struct TraceWriter {
    path: PathBuf,
    part: PathBuf,
    data: BufWriter<File>,
    header: serde_json::Map<String, serde_json::Value>,
    offset: usize,
}

/// Unfinished (an error on the way): its partial bytes are of no use to anyone. After
/// `finish` there is nothing left to remove.
impl Drop for TraceWriter {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.part);
    }
}

impl TraceWriter {
    pub fn create(path: &Path) -> Result<Self> {
        let part = path.with_extension("safetensors.part");
        let file = File::create(&part).map_err(|e| Error::io(format!("creating {}", part.display()), e))?;
        // A killed rank runs no destructor: the launcher removes what is left of it.
        ddp_verify_launch::register_partial(&part);
        let header = serde_json::Map::new();
        Ok(TraceWriter { path: path.into(), part, data: BufWriter::new(file), header, offset: 0 })
    }

    /// Step `s`'s gradients, as `grads.<s>.<param>`.
    pub fn step(&mut self, s: usize, grads: &Params) -> Result<()> {
        grads.iter().try_for_each(|(n, t)| self.add(&K::Grads.name(s, n), t))
    }

    /// The finals, buffers and peaks of `trace` (its steps were written with `step`), then
    /// the file itself.
    pub fn finish(mut self, trace: &Trace) -> Result<()> {
        for (kind, group) in [(K::Final, &trace.finals), (K::Buffer, &trace.buffers), (K::Peak, &trace.peaks)] {
            group.iter().try_for_each(|(n, t)| self.add(&kind.name(0, n), t))?;
        }
        let facts = &trace.facts;
        for (s, lr) in facts.lrs.iter().enumerate() {
            self.add(&K::Lr.name(s, ""), &Values::f64s(vec![*lr]))?;
        }
        for (s, n) in facts.clips.iter().enumerate() {
            self.add(&K::Clips.name(s, ""), &Values::i64s(vec![*n]))?;
        }
        for (s, c) in facts.comm.iter().enumerate() {
            if let Some((count, bytes)) = c {
                self.add(&K::Comm.name(s, ""), &Values::i64s(vec![*count, *bytes]))?;
            }
        }
        let parts = trace.allowances.range_parts.iter().flat_map(|p| p.tensors());
        for (name, t) in facts.scaler.tensors().into_iter().chain(parts) {
            self.add(&name, &t)?;
        }
        for (s, scales) in trace.scales.iter().enumerate() {
            scales.iter().try_for_each(|(n, t)| self.add(&K::Scale.name(s, n), t))?;
        }
        if let Some(s) = &trace.sampling {
            for (n, p) in &s.params {
                self.add(&K::Positions.name(0, n), &Values::i64s(p.positions.iter().map(|&k| k as i64).collect()))?;
                self.add(&K::ParamShape.name(0, n), &Values::i64s(p.shape.iter().map(|&d| d as i64).collect()))?;
            }
            for (step, summaries) in s.steps.iter().enumerate() {
                summaries.iter().try_for_each(|(n, m)| self.add(&K::Summary.name(step, n), &m.to_values()))?;
            }
            s.finals.iter().try_for_each(|(n, m)| self.add(&K::FinalSummary.name(0, n), &m.to_values()))?;
        }
        if trace.header.is_present() {
            self.header.insert("__metadata__".into(), serde_json::json!(trace.header.to_strings()));
        }
        let err = |e| Error::io(format!("writing {}", self.path.display()), e);
        self.data.flush().map_err(err)?;
        let mut header = serde_json::to_string(&self.header).expect("header serialises").into_bytes();
        // Pad with spaces to 8 bytes, as the safetensors library does, so the data is aligned.
        header.resize(header.len().div_ceil(8) * 8, b' ');
        let mut out = BufWriter::new(File::create(&self.path).map_err(err)?);
        out.write_all(&(header.len() as u64).to_le_bytes()).map_err(err)?;
        out.write_all(&header).map_err(err)?;
        std::io::copy(&mut File::open(&self.part).map_err(err)?, &mut out).map_err(err)?;
        out.flush().map_err(err)?;
        std::fs::remove_file(&self.part).map_err(err)
    }

    fn add(&mut self, name: &str, t: &Values) -> Result<()> {
        let bytes = t.le_bytes();
        self.data.write_all(&bytes).map_err(|e| Error::io(format!("writing {}", self.part.display()), e))?;
        let entry = serde_json::json!({
            "dtype": t.elem().name(),
            "shape": t.shape(),
            "data_offsets": [self.offset, self.offset + bytes.len()],
        });
        self.header.insert(name.to_string(), entry);
        self.offset += bytes.len();
        Ok(())
    }
}
