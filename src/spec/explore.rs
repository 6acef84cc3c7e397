//! `explore`'s options: the flags both subjects share ([`Exploration`]), then our own
//! models' ([`ExploreOptions`]) and a user's script's ([`ScriptExplore`]), and what one case
//! of a script is ([`Draw`]; our models' is a [`super::TrainConfig`]).

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::{Bug, KernelMode, ModelKind, ScriptOptions, ToleranceOverrides};

/// What every explore takes, whatever it explores: how many cases, the seed that draws
/// them, the most ranks a case may use, and the file failures are kept in.
#[derive(Clone, Debug)]
pub struct Exploration {
    /// Cases drawn (per pass, for our models).
    pub cases: usize,
    pub seed: u64,
    pub max_gpus: usize,
    /// Minimal failing cases, replayed first and appended to (proptest's idea of persisted
    /// regressions, stored as the cases themselves).
    pub regressions: PathBuf,
    /// Print the report as JSON instead of text.
    pub json: bool,
}

/// `explore`: our own models.
pub struct ExploreOptions {
    pub exploration: Exploration,
    /// The models configurations are drawn for (linear, resnet-tiny, tiny-lm).
    pub models: Vec<ModelKind>,
    /// One pass per entry; `None` is the honest run.
    pub bugs: Vec<Option<Bug>>,
    /// --max-ulps/--rtol/--atol, if given; else each case is held to its derived bounds.
    pub tolerance: ToleranceOverrides,
    pub progress: bool,
    /// The CPU kernels every case computes with.
    pub kernels: KernelMode,
}

/// `explore -- COMMAND`: configurations drawn for a user's script, each run as
/// `ddp-verify -- COMMAND` runs it.
pub struct ScriptExplore {
    pub exploration: Exploration,
    /// What every case shares (its K, W, B, output folder and fills are each case's).
    pub script: ScriptOptions,
    /// The command as given, placeholders and all: what a regression is kept under.
    pub command: Vec<String>,
    pub max_time: Option<f64>,
    /// The placeholders the command takes: only those are drawn.
    pub takes: Takes,
    pub axes: Vec<Axis>,
}

/// Which of the drawn placeholders a command takes.
#[derive(Clone, Copy, Debug, Default)]
pub struct Takes {
    pub batch: bool,
    pub data_size: bool,
    pub seed: bool,
}

/// `--axis NAME=V1,V2,...`: a user's own placeholder and its values, the first the simplest.
#[derive(Clone, Debug)]
pub struct Axis {
    pub name: String,
    pub values: Vec<String>,
}

/// One configuration of a user's command: what `explore -- COMMAND` draws, runs, shrinks
/// and keeps in the regressions file.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Draw {
    pub gpus: usize,
    pub acc_steps: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_size: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Each axis's value, by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub axes: BTreeMap<String, String>,
}

impl Draw {
    /// The placeholders this draw fills beyond K, W and B, by name.
    pub fn fills(&self) -> Vec<(String, String)> {
        let mut f: Vec<(String, String)> = self.axes.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        f.extend(self.data_size.map(|n| ("data_size".to_string(), n.to_string())));
        f.extend(self.seed.map(|s| ("seed".to_string(), s.to_string())));
        f
    }

    /// In a few words, for progress lines: "W=2 K=4 B=1 N=11 lr=0.1".
    pub fn short(&self) -> String {
        let mut s = format!("W={} K={}", self.gpus, self.acc_steps);
        s.extend(self.batch.map(|b| format!(" B={b}")));
        s.extend(self.data_size.map(|n| format!(" N={n}")));
        s.extend(self.seed.map(|n| format!(" seed={n}")));
        for (k, v) in &self.axes {
            s.push_str(&format!(" {k}={v}"));
        }
        s
    }
}
