//! Minimal failing configurations, persisted as proptest persists its regressions, but as
//! the configurations themselves: one JSON line each, replayed first on the next run.

use std::path::PathBuf;

use crate::error::{Error, Result};
use crate::spec::TrainConfig;

/// The regressions file's configurations; a line that is not one is refused (exit 2), never
/// skipped in silence. Configurations today's rules refuse are left out.
pub fn read_regressions(path: Option<&PathBuf>) -> Result<Vec<TrainConfig>> {
    let Some(path) = path.filter(|p| p.exists()) else { return Ok(Vec::new()) };
    let fix = "fix or delete the file (explore writes one configuration as JSON per line)";
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::bad_file(path, format!("--regressions cannot be read ({e})"), fix))?;
    let mut configs = Vec::new();
    for (i, line) in text.lines().enumerate() {
        // A user's command's line (`explore -- COMMAND`) shares the file.
        let theirs = crate::jobs::explore_script::is_script_line(line);
        if line.trim_start().starts_with('#') || line.trim().is_empty() || theirs {
            continue;
        }
        let cfg: TrainConfig = serde_json::from_str(line).map_err(|e| {
            Error::bad_file(path, format!("--regressions line {} is not a configuration ({e})", i + 1), fix)
        })?;
        if crate::plan::checks::check_train(&cfg).is_ok() {
            configs.push(cfg);
        }
    }
    Ok(configs)
}

/// Appends a minimal failing configuration; a failure to write it is an error, not a
/// finding lost in silence.
pub(super) fn append_regression(path: Option<&PathBuf>, cfg: &TrainConfig) -> Result<()> {
    let Some(path) = path else { return Ok(()) };
    crate::jobs::explore_script::append_line(path, &serde_json::to_string(cfg).expect("config serialises"))
}
