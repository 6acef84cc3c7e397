//! Reference traces made by real PyTorch (`fixtures/`): `DIR/config.json` says what made
//! them; `DIR/accumulation.safetensors` and `DIR/ddp.safetensors` hold the traces.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::config::TrainConfig;
use crate::error::{Error, Result};
use crate::trace::Trace;

#[derive(Debug, Clone, Deserialize)]
pub struct GoldenMeta {
    pub train: TrainConfig,
    pub torch_version: String,
}

pub struct Golden {
    pub dir: PathBuf,
    pub meta: GoldenMeta,
    pub accumulation: Trace,
    pub ddp: Trace,
}

const REGENERATE: &str = "regenerate goldens with fixtures/make_golden.sh";

impl Golden {
    /// Loads a golden and refuses one made for another configuration, naming the first flag
    /// that differs, so a golden is never silently compared against the wrong run.
    pub fn load(dir: &Path, train: &TrainConfig) -> Result<Golden> {
        if !dir.is_dir() {
            return Err(Error::bad_flag(
                "--golden",
                format!("{} is not a directory", dir.display()),
                "pass a golden directory such as golden/article",
            ));
        }
        let meta_path = dir.join("config.json");
        let text = std::fs::read_to_string(&meta_path)
            .map_err(|e| Error::bad_file(&meta_path, format!("cannot read ({e})"), REGENERATE))?;
        let meta: GoldenMeta = serde_json::from_str(&text)
            .map_err(|e| Error::bad_file(&meta_path, format!("not a golden config ({e})"), REGENERATE))?;
        if let Some((flag, golden, ours)) = first_difference(&meta.train, train) {
            return Err(Error::bad_file(
                dir,
                format!("golden was made with {flag} {golden} but this run has {flag} {ours}"),
                format!("pass the flags in {} or choose the golden for this config", meta_path.display()),
            ));
        }
        let accumulation = Trace::load(&dir.join("accumulation.safetensors"))?;
        let ddp = Trace::load(&dir.join("ddp.safetensors"))?;
        Ok(Golden { dir: dir.into(), meta, accumulation, ddp })
    }
}

/// The first field that differs, as (flag, golden value, our value).
fn first_difference(golden: &TrainConfig, ours: &TrainConfig) -> Option<(String, String, String)> {
    let g = serde_json::to_value(golden).ok()?;
    let o = serde_json::to_value(ours).ok()?;
    let (g, o) = (g.as_object()?, o.as_object()?);
    g.iter().find(|(k, v)| o.get(*k) != Some(v)).map(|(k, v)| {
        (format!("--{}", k.replace('_', "-")), v.to_string(), o.get(k).map_or("?".into(), |x| x.to_string()))
    })
}
