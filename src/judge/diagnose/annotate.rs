//! The pipeline's last step: known upstream fixes, as data (`known_fixes.toml`): a library's
//! versions, the stage and mechanism a parting was located at, and the upstream issue or PR
//! with the version that fixed it. A row only annotates a cause already located and owned
//! from recorded facts: neither the verdict, the stage nor the owner ever depends on it.

use std::sync::LazyLock;

use serde::{Deserialize, Serialize};

use super::owner::Owner;
use super::parting::Parting;
use super::words::Stage;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KnownFix {
    pub library: String,
    /// The first version with the bug and the first without (`fixed_in`), both inclusive
    /// of what they name: affected when `from <= version < fixed_in`.
    pub from: String,
    pub fixed_in: String,
    pub stage: String,
    /// The mechanism's word (`Mechanism::name`).
    pub mechanism: String,
    pub tracker: String,
    pub what: String,
}

#[derive(Deserialize)]
struct Table {
    fix: Vec<KnownFix>,
}

/// The table, parsed once (a unit test holds it to parse).
pub static KNOWN_FIXES: LazyLock<Vec<KnownFix>> =
    LazyLock::new(|| toml::from_str::<Table>(include_str!("known_fixes.toml")).map(|t| t.fix).unwrap_or_default());

/// A version as numbers ("0.18.3" → [0, 18, 3]; "2.8.0+cpu" → [2, 8, 0]; a pre-release's
/// letters end its numbers).
fn numbers(v: &str) -> Vec<u64> {
    v.split(['+', '-']).next().unwrap_or("").split('.').map_while(|p| p.parse().ok()).collect()
}

fn less(a: &str, b: &str) -> bool {
    numbers(a) < numbers(b)
}

/// The known fix for a located and owned parting, where the table has one.
pub fn known_fix(p: &Parting, owner: &Owner) -> Option<&'static KnownFix> {
    lookup(owner, p.stage?, p.mechanism.name())
}

fn lookup(owner: &Owner, stage: Stage, mechanism: &str) -> Option<&'static KnownFix> {
    let (name, version) = (owner.name(), owner.version()?);
    KNOWN_FIXES.iter().find(|f| {
        f.library == name
            && f.stage == stage.name()
            && f.mechanism == mechanism
            && !less(version, &f.from)
            && less(version, &f.fixed_in)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_parses_and_names_real_stages() {
        let t: Table = toml::from_str(include_str!("known_fixes.toml")).expect("known_fixes.toml parses");
        assert_eq!(t.fix.len(), KNOWN_FIXES.len());
        assert!(!t.fix.is_empty());
        for f in &t.fix {
            assert!(Stage::parse(&f.stage).is_some(), "{f:?}");
            assert!(less(&f.from, &f.fixed_in), "{f:?}");
            assert!(super::super::words::Mechanism::parse(&f.mechanism).is_some(), "{f:?}");
            assert!(f.tracker.starts_with("https://github.com/"), "{f:?}");
        }
    }

    #[test]
    fn versions_compare_by_their_numbers() {
        assert!(less("0.9.1", "0.18.3") && less("2.8.0+cpu", "2.9.0") && !less("4.54.0", "4.54.0"));
        assert!(less("4.46.0", "4.54.0") && !less("4.54.1", "4.54.0"));
    }
}
