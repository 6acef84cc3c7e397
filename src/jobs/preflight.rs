//! What depends on this machine rather than the flags, checked before any training by one
//! process: the one that starts the ranks, and again by rank 0 (cheap, and it writes
//! nothing, so a rank never depends on having been started by us).

use std::path::Path;

use crate::error::{Error, Result};
use crate::evidence::{golden, SAVED_FILES};
use crate::spec::Config;
use crate::train::{fits, models};

/// What depends on this machine rather than the flags: --init readable and fitting the
/// model, W ranks fitting in memory, every output writable and nothing overwritten without
/// --force, and --bless's rules.
pub fn preflight(cfg: &Config) -> Result<()> {
    let t = &cfg.train;
    if let Some(path) = t.model.init.as_deref().filter(|p| !p.is_file()) {
        return Err(Error::bad_file(
            path,
            format!("--init {}", crate::error::what_is(path)),
            "pass a state_dict saved with safetensors",
        ));
    }
    fits::check_fits(t, fits::available_bytes)?;
    models::check_init(t)?;
    if let Some(dir) = &cfg.save_trace {
        check_save_trace(dir, cfg.force)?;
    }
    crate::report::check_targets(&cfg.reports, cfg.plot.as_ref(), cfg.force)?;
    if cfg.bless {
        let Some(dir) = &cfg.golden else {
            return Err(Error::bad_flag("--bless", "needs --golden DIR to know where to write", "add --golden DIR"));
        };
        if golden::on_ci() {
            return Err(Error::bad_flag(
                "--bless",
                "refusing to write goldens on CI (the CI variable is set)",
                "bless locally, review the files, and commit them",
            ));
        }
        if t.inject.is_some() {
            return Err(Error::bad_flag("--bless", "refusing to bless a run with an injected bug", "drop --inject"));
        }
        golden::check_blessable(dir)?;
    }
    Ok(())
}

fn check_save_trace(dir: &Path, force: bool) -> Result<()> {
    crate::outputs::check_dir("--save-trace", dir, true)?;
    if force {
        return Ok(());
    }
    if let Some(f) = SAVED_FILES.iter().map(|f| dir.join(f)).find(|p| p.exists()) {
        return Err(Error::bad_file(
            f,
            "--save-trace would overwrite this file",
            "choose another directory or pass --force",
        ));
    }
    Ok(())
}
