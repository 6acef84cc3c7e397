//! `DDP_VERIFY_PROFILE=FILE`: every process appends timestamped phase marks to FILE, on one
//! clock (Unix time), so a run's time can be split across the launcher and its ranks
//! (bench/profile.sh reads them).

use std::io::Write;
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

fn target() -> Option<&'static std::path::Path> {
    static FILE: OnceLock<Option<std::path::PathBuf>> = OnceLock::new();
    FILE.get_or_init(|| std::env::var_os("DDP_VERIFY_PROFILE").filter(|v| !v.is_empty()).map(Into::into)).as_deref()
}

/// Appends `<unix seconds> <who> <what>` when profiling is on; one write per line, so the
/// lines of several processes never interleave.
pub fn mark(what: &str) {
    let Some(path) = target() else { return };
    let t = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
    let who = crate::env_rank().map_or("launcher".to_string(), |r| format!("rank{r}"));
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
        let _ = f.write_all(format!("{t:.3} {who} {what}\n").as_bytes());
    }
}
