//! An owner: the user's script, or a library at the version the run imported (the header's
//! `versions`) with its API. `own` decides whose a parting is; this only says who is who.

use serde::Serialize;

use crate::evidence::{Engine, Framework, Trace};

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Owner {
    /// The user's training script (or, for ddp-verify's own runs, its configuration).
    Script,
    Library {
        /// The Python distribution: torch, transformers, accelerate, deepspeed, lightning, ...
        name: String,
        /// As the run imported it, where the header says.
        #[serde(skip_serializing_if = "Option::is_none")]
        version: Option<String>,
        /// The API at fault (`accelerator.backward`, FSDP2's reduce-scatter, ...).
        api: String,
    },
}

impl Owner {
    pub fn library(t: &Trace, name: &str, api: impl Into<String>) -> Owner {
        Owner::Library { name: name.to_string(), version: version(t, name), api: api.into() }
    }

    /// The owner of what a framework's code did: the script where `plain`.
    pub fn of_framework(t: &Trace, f: Framework, api: impl Into<String>) -> Owner {
        match library_of(f) {
            Some(lib) => Owner::library(t, lib, api),
            None => Owner::Script,
        }
    }

    /// The library whose code reduces gradients under `engine`.
    pub fn of_engine(t: &Trace, engine: Option<Engine>) -> Owner {
        match engine {
            Some(Engine::Ddp) | None => Owner::library(t, "torch", "DistributedDataParallel's all-reduce"),
            Some(Engine::Fsdp2) => Owner::library(t, "torch", "FSDP2's reduce-scatter (fully_shard)"),
            Some(e) => Owner::library(t, "deepspeed", format!("ZeRO's gradient reduction ({})", e.name())),
        }
    }

    pub fn is_library(&self) -> bool {
        matches!(self, Owner::Library { .. })
    }

    /// In words, for a report: "your script", "deepspeed 0.18.3 (engine.backward)".
    pub fn describe(&self) -> String {
        match self {
            Owner::Script => "your script".into(),
            Owner::Library { name, version, api } => match version {
                Some(v) => format!("{name} {v} ({api})"),
                None => format!("{name} ({api})"),
            },
        }
    }

    pub fn name(&self) -> &str {
        match self {
            Owner::Script => "script",
            Owner::Library { name, .. } => name,
        }
    }

    pub fn version(&self) -> Option<&str> {
        match self {
            Owner::Script => None,
            Owner::Library { version, .. } => version.as_deref(),
        }
    }
}

/// The Python distribution behind a framework word (the script's own code where none).
pub fn library_of(f: Framework) -> Option<&'static str> {
    match f {
        Framework::Plain => None,
        Framework::Transformers => Some("transformers"),
        Framework::Lightning => Some("lightning"),
        Framework::ColossalAi => Some("colossalai"),
        Framework::Accelerate => Some("accelerate"),
        Framework::DeepSpeed => Some("deepspeed"),
    }
}

/// `name`'s version in the header's `versions` ("torch==2.8.0, deepspeed==0.18.3"), or
/// torch's from `torch_version`.
pub fn version(t: &Trace, name: &str) -> Option<String> {
    // Lightning's older releases are the `pytorch_lightning` package.
    let names: &[&str] = if name == "lightning" { &["lightning", "pytorch_lightning"] } else { &[name] };
    let listed = t.header.versions.as_deref().and_then(|v| {
        v.split(',')
            .filter_map(|p| p.trim().split_once("=="))
            .find(|(n, _)| names.contains(n))
            .map(|(_, v)| v.to_string())
    });
    listed.or_else(|| (name == "torch").then(|| t.header.torch_version.clone()).flatten())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_read_from_the_header() {
        let mut t = Trace::default();
        t.header.versions = Some("torch==2.8.0, deepspeed==0.18.3".into());
        assert_eq!(version(&t, "deepspeed").as_deref(), Some("0.18.3"));
        assert_eq!(version(&t, "torch").as_deref(), Some("2.8.0"));
        assert_eq!(version(&t, "accelerate"), None);
        let o = Owner::of_engine(&t, Some(Engine::DeepSpeed2));
        assert_eq!(o.describe(), "deepspeed 0.18.3 (ZeRO's gradient reduction (deepspeed-zero2))");
        assert_eq!(Owner::of_framework(&t, Framework::Plain, "x"), Owner::Script);
        t.header.versions = Some("torch==2.1.0, pytorch_lightning==2.0.9".into());
        assert_eq!(version(&t, "lightning").as_deref(), Some("2.0.9"));
    }
}
