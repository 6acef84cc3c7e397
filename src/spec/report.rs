//! Which reports to write, and where (`--report`, `--report-file`).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::Format;

/// One `--report FORMAT [--report-file PATH]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportTarget {
    pub format: Format,
    /// None (or `-`) is stdout.
    pub path: Option<PathBuf>,
}

impl ReportTarget {
    /// The file to write, or None for stdout.
    pub fn file(&self) -> Option<&PathBuf> {
        self.path.as_ref().filter(|p| p.as_os_str() != "-")
    }
}
