//! Which reports to write, and where (`--report`, `--report-file`).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use ddp_verify_cli::names;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    Table,
    Json,
    Markdown,
    Junit,
}

impl Format {
    const ALL: [Format; 4] = [Format::Table, Format::Json, Format::Markdown, Format::Junit];
    pub const NAMES: [&'static str; 4] = names::FORMATS;

    /// A name of `names::FORMATS`, or one of its aliases.
    pub fn parse(s: &str) -> Option<Format> {
        let s = names::format(s).ok()?;
        let i = names::FORMATS.iter().position(|n| *n == s)?;
        Some(Format::ALL[i])
    }
}

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
