//! The stages two trainings pass through, walked in order from recorded facts: samples →
//! loss → scaling before backward → local gradient → reduction → applied update. The first
//! stage where the legs part is named with its numbers and its owner: the user's script, or
//! a library at its version and the API at fault. Recorded facts (the recorder's stage
//! facts, `evidence::StageStep`) decide; a table of known upstream fixes only annotates a
//! stage found here (`known`). Where the facts were not recorded, the older rules speak, and
//! their reason names the stage (`Reason::stage`).

mod known;
mod measure;
mod owner;
mod walk;

pub use known::KnownFix;
pub use owner::Owner;
pub use walk::{cadence, dealer, library_at_fault, rule_owner, walk};

use serde::{Serialize, Serializer};

/// Where two trainings part, in the order a micro-batch passes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stage {
    Samples,
    Loss,
    Scaling,
    LocalGradient,
    Reduction,
    Update,
}

impl Stage {
    pub const ALL: [Stage; 6] =
        [Stage::Samples, Stage::Loss, Stage::Scaling, Stage::LocalGradient, Stage::Reduction, Stage::Update];

    /// The report's word (`diagnosis.stage`), and the corpus manifest's.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Samples => "samples",
            Stage::Loss => "loss",
            Stage::Scaling => "scaling",
            Stage::LocalGradient => "local gradient",
            Stage::Reduction => "reduction",
            Stage::Update => "update",
        }
    }

    pub fn parse(word: &str) -> Option<Stage> {
        Stage::ALL.into_iter().find(|s| s.name() == word)
    }
}

impl Serialize for Stage {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// A located cause: the stage, whose code owns it, and a known upstream fix where the table
/// has one for that library, version, stage and mechanism.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Located {
    pub stage: Stage,
    pub owner: Owner,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub known_fix: Option<&'static KnownFix>,
}

#[cfg(test)]
mod tests;
