//! A trace's header, typed: what wrote it, how many processes, K, the dtype, the optimizer
//! and its settings, the framework. Read by the key table in [`super::schema`]; a header
//! that lacks a key `compare` relies on, or holds one that does not parse, is refused
//! naming the key. Outside `evidence`, nothing looks a header key up by string.

use std::collections::BTreeMap;

use super::schema::{self, Value};
use crate::spec::Dtype;

/// What wrote a trace: ddp-verify's own accumulation run, the recorder's one process, or
/// DDP (either's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunKind {
    Accumulation,
    Single,
    Ddp,
}

/// The leg `ddp-verify -- COMMAND` ran a script as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leg {
    Accumulation,
    Ddp,
    BigBatch,
}

/// How the recorder measured each step's micro-batch magnitudes (`scale.<s>.<p>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Magnitudes {
    PerElement,
    PerTensor,
    None,
}

/// The framework that called optimizer.step() in a user's run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framework {
    Plain,
    Transformers,
    Lightning,
    ColossalAi,
    Accelerate,
    DeepSpeed,
}

/// What synchronised a multi-process run's gradients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    Ddp,
    Fsdp2,
    DeepSpeed0,
    DeepSpeed1,
    DeepSpeed2,
    DeepSpeed3,
}

/// The stepping optimizer, by class: the ones whose steps a bound is carried through, and
/// the rest by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OptimizerKind {
    Sgd,
    Adam,
    AdamW,
    Other(String),
}

impl OptimizerKind {
    fn parse(class: &str) -> Self {
        match class {
            "SGD" => OptimizerKind::Sgd,
            "Adam" => OptimizerKind::Adam,
            "AdamW" => OptimizerKind::AdamW,
            other => OptimizerKind::Other(other.to_string()),
        }
    }

    /// The class name, as the header writes it.
    pub fn name(&self) -> &str {
        match self {
            OptimizerKind::Sgd => "SGD",
            OptimizerKind::Adam => "Adam",
            OptimizerKind::AdamW => "AdamW",
            OptimizerKind::Other(n) => n,
        }
    }
}

/// The optimizer and its first param group's settings, as recorded.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct OptimizerRecord {
    pub kind: Option<OptimizerKind>,
    pub betas: Option<Vec<f64>>,
    pub eps: Option<f64>,
    pub weight_decay: Option<f64>,
    pub momentum: Option<f64>,
    pub dampening: Option<f64>,
    pub amsgrad: Option<bool>,
    pub nesterov: Option<bool>,
    pub maximize: Option<bool>,
}

impl OptimizerRecord {
    /// Adam's family (Adam, AdamW, Adamax, ...): each divides by a running magnitude, which
    /// hides a gradient's overall scale from the weights.
    pub fn is_adam_family(&self) -> bool {
        self.kind.as_ref().is_some_and(|k| k.name().starts_with("Adam"))
    }

    /// AdamW, or Adam without weight decay (the same steps): what `judge::adamw_finals`
    /// carries a bound through. Adam with weight decay adds it to the gradient (L2), a
    /// recurrence that bound does not carry.
    pub fn carries_adamw_bound(&self) -> bool {
        match self.kind {
            Some(OptimizerKind::AdamW) => true,
            Some(OptimizerKind::Adam) => self.weight_decay == Some(0.0),
            _ => false,
        }
    }

    /// SGD, or not said: its steps are linear in the gradients, so final weights keep the
    /// fixed tolerance.
    pub fn is_sgd_or_unknown(&self) -> bool {
        matches!(self.kind, None | Some(OptimizerKind::Sgd))
    }
}

/// A trace file's header. `version` is None where the file has none (PyTorch's goldens, a
/// bare safetensors file): then nothing else is known either.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TraceHeader {
    pub version: Option<u32>,
    pub run: Option<RunKind>,
    pub leg: Option<Leg>,
    pub world_size: Option<usize>,
    pub acc_steps: Option<usize>,
    pub steps_per_epoch: Option<usize>,
    pub steps: Option<usize>,
    pub dtype: Option<Dtype>,
    pub magnitudes: Option<Magnitudes>,
    pub framework: Option<Framework>,
    pub optimizer: OptimizerRecord,
    /// Whether any DistributedDataParallel forward ran (the recorder's, under DDP).
    pub ddp_forward_seen: Option<bool>,
    /// The dropout layers that train, in words.
    pub dropout: Option<String>,
    /// Other optimizers that stepped unrecorded, by class.
    pub unrecorded_optimizers: Option<String>,
    pub written_by: Option<String>,
    pub recorded_by: Option<String>,
    pub torch_version: Option<String>,
    /// Sampled: the element positions kept per tensor (tensors this large or smaller whole).
    pub sample: Option<usize>,
    /// Elements in all the recorded parameters.
    pub parameters: Option<usize>,
    /// What synchronised the ranks' gradients (DDP, FSDP2, DeepSpeed ZeRO).
    pub engine: Option<Engine>,
    /// What a sharded engine divided the reduced gradients by (the world size: averaged).
    pub grad_divide: Option<f64>,
    /// The forward and backward's dtype where the engine casts the weights (FSDP2's
    /// MixedPrecisionPolicy), when it differs from `dtype`.
    pub compute_dtype: Option<Dtype>,
    /// The engine's own accumulation steps (DeepSpeed's gradient_accumulation_steps).
    pub engine_accumulation: Option<usize>,
    /// What the recorder could not record; the training went on.
    pub warnings: Option<String>,
    /// Keys this build does not know, kept as written.
    pub other: BTreeMap<String, String>,
}

/// Each enum's words, as the schema lists them, by position.
macro_rules! words {
    ($ty:ident, $table:expr, [$($variant:ident),+]) => {
        impl $ty {
            const ALL: &'static [$ty] = &[$($ty::$variant),+];

            fn parse(s: &str) -> Option<$ty> {
                $table.iter().position(|w| *w == s).map(|i| Self::ALL[i])
            }

            pub fn name(self) -> &'static str {
                $table[Self::ALL.iter().position(|v| *v == self).expect("listed")]
            }
        }
    };
}

words!(RunKind, schema::RUNS, [Accumulation, Single, Ddp]);
words!(Leg, schema::LEGS, [Accumulation, Ddp, BigBatch]);
words!(Magnitudes, schema::MAGNITUDE_KINDS, [PerElement, PerTensor, None]);
words!(Framework, schema::FRAMEWORK_NAMES, [Plain, Transformers, Lightning, ColossalAi, Accelerate, DeepSpeed]);
words!(Engine, schema::ENGINES, [Ddp, Fsdp2, DeepSpeed0, DeepSpeed1, DeepSpeed2, DeepSpeed3]);

impl Engine {
    /// Shards parameters, gradients or optimizer state over the ranks.
    pub fn is_sharded(self) -> bool {
        self != Engine::Ddp
    }

    /// How a loop tells this engine to skip the gradient reduction of a micro-batch.
    pub fn no_sync(self) -> &'static str {
        match self {
            Engine::Ddp => "no_sync()",
            Engine::Fsdp2 => "set_requires_gradient_sync(False)",
            _ => "DeepSpeed's gradient_accumulation_steps (engine.backward reduces at its boundary only)",
        }
    }
}

impl RunKind {
    /// One process: ddp-verify's accumulation run, or the recorder's outside DDP.
    pub fn is_one_process(self) -> bool {
        self != RunKind::Ddp
    }
}

/// Why a header was refused: the key, and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderProblem {
    pub key: &'static str,
    pub problem: String,
}

impl std::fmt::Display for HeaderProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "header key {}: {}", self.key, self.problem)
    }
}

impl TraceHeader {
    /// The header of `raw` (a safetensors `__metadata__`; empty when the file has none).
    pub fn parse(raw: &BTreeMap<String, String>) -> Result<TraceHeader, HeaderProblem> {
        if raw.is_empty() {
            return Ok(TraceHeader::default());
        }
        let bad = |key: &'static str, problem: String| HeaderProblem { key, problem };
        let version = version(raw.get(schema::FORMAT).map(String::as_str)).map_err(|p| bad(schema::FORMAT, p))?;
        for key in schema::keys() {
            // A required key written empty says no more than one left out.
            match raw.get(key.name).map(String::as_str).filter(|v| !(key.required && v.is_empty())) {
                None if key.required => {
                    let problem = format!("missing; every {} header has it", schema::format());
                    return Err(bad(key.name, problem));
                }
                None => {}
                Some(v) => check(key.value, v).map_err(|p| bad(key.name, p))?,
            }
        }
        let text = |k: &str| raw.get(k).filter(|v| !v.is_empty()).cloned();
        let count = |k: &str| text(k).and_then(|v| v.trim().parse::<usize>().ok());
        let number = |k: &str| text(k).and_then(|v| v.trim().parse::<f64>().ok());
        let flag = |k: &str| text(k).map(|v| v.eq_ignore_ascii_case("true"));
        let known = |k: &str| schema::keys().any(|key| key.name == k);
        Ok(TraceHeader {
            version: Some(version),
            run: text(schema::RUN).and_then(|v| RunKind::parse(&v)),
            leg: text(schema::LEG).and_then(|v| Leg::parse(&v)),
            world_size: count(schema::WORLD_SIZE),
            acc_steps: count(schema::ACC_STEPS),
            steps_per_epoch: count(schema::STEPS_PER_EPOCH),
            steps: count(schema::STEPS),
            dtype: text(schema::DTYPE).and_then(|v| Dtype::ALL.into_iter().find(|d| d.name() == v)),
            magnitudes: text(schema::MAGNITUDES).and_then(|v| Magnitudes::parse(&v)),
            framework: text(schema::FRAMEWORK).and_then(|v| Framework::parse(&v)),
            optimizer: OptimizerRecord {
                kind: text(schema::OPTIMIZER).map(|v| OptimizerKind::parse(&v)),
                betas: text(schema::BETAS).map(|v| numbers(&v).unwrap_or_default()),
                eps: number(schema::EPS),
                weight_decay: number(schema::WEIGHT_DECAY),
                momentum: number(schema::MOMENTUM),
                dampening: number(schema::DAMPENING),
                amsgrad: flag(schema::AMSGRAD),
                nesterov: flag(schema::NESTEROV),
                maximize: flag(schema::MAXIMIZE),
            },
            ddp_forward_seen: text(schema::DDP_FORWARD).map(|v| v == "seen"),
            dropout: text(schema::DROPOUT),
            unrecorded_optimizers: text(schema::UNRECORDED_OPTIMIZERS),
            written_by: text(schema::WRITTEN_BY),
            recorded_by: text(schema::RECORDED_BY),
            torch_version: text(schema::TORCH_VERSION),
            sample: count(schema::SAMPLE),
            parameters: count(schema::PARAMETERS),
            engine: text(schema::ENGINE).and_then(|v| Engine::parse(&v)),
            grad_divide: number(schema::GRAD_DIVIDE),
            compute_dtype: text(schema::COMPUTE_DTYPE).and_then(|v| Dtype::ALL.into_iter().find(|d| d.name() == v)),
            engine_accumulation: count(schema::ENGINE_ACCUMULATION),
            warnings: text(schema::WARNINGS),
            other: raw.iter().filter(|(k, _)| !known(k)).map(|(k, v)| (k.clone(), v.clone())).collect(),
        })
    }

    /// The header as the file holds it: string to string, in the recorder's spellings.
    pub fn to_strings(&self) -> BTreeMap<String, String> {
        let Some(version) = self.version else { return BTreeMap::new() };
        let mut out = self.other.clone();
        let mut put = |k: &str, v: Option<String>| {
            if let Some(v) = v {
                out.insert(k.to_string(), v);
            }
        };
        let num = |v: Option<f64>| v.map(|v| format!("{v:?}"));
        let flag = |v: Option<bool>| v.map(|v| if v { "True" } else { "False" }.to_string());
        put(schema::FORMAT, Some(format!("{}/{version}", schema::FORMAT_NAME)));
        put(schema::RUN, self.run.map(|r| r.name().into()));
        put(schema::LEG, self.leg.map(|l| l.name().into()));
        put(schema::WORLD_SIZE, self.world_size.map(|n| n.to_string()));
        put(schema::ACC_STEPS, self.acc_steps.map(|n| n.to_string()));
        put(schema::STEPS_PER_EPOCH, self.steps_per_epoch.map(|n| n.to_string()));
        put(schema::STEPS, self.steps.map(|n| n.to_string()));
        put(schema::DTYPE, self.dtype.map(|d| d.name().into()));
        put(schema::MAGNITUDES, self.magnitudes.map(|m| m.name().into()));
        put(schema::FRAMEWORK, self.framework.map(|f| f.name().into()));
        let o = &self.optimizer;
        put(schema::OPTIMIZER, o.kind.as_ref().map(|k| k.name().into()));
        put(schema::BETAS, o.betas.as_ref().map(|b| b.iter().map(|v| format!("{v:?}")).collect::<Vec<_>>().join(" ")));
        put(schema::EPS, num(o.eps));
        put(schema::WEIGHT_DECAY, num(o.weight_decay));
        put(schema::MOMENTUM, num(o.momentum));
        put(schema::DAMPENING, num(o.dampening));
        put(schema::AMSGRAD, flag(o.amsgrad));
        put(schema::NESTEROV, flag(o.nesterov));
        put(schema::MAXIMIZE, flag(o.maximize));
        put(schema::DDP_FORWARD, self.ddp_forward_seen.map(|s| if s { "seen" } else { "none" }.into()));
        put(schema::DROPOUT, self.dropout.clone());
        put(schema::UNRECORDED_OPTIMIZERS, self.unrecorded_optimizers.clone());
        put(schema::WRITTEN_BY, self.written_by.clone());
        put(schema::RECORDED_BY, self.recorded_by.clone());
        put(schema::TORCH_VERSION, self.torch_version.clone());
        put(schema::SAMPLE, self.sample.map(|n| n.to_string()));
        put(schema::PARAMETERS, self.parameters.map(|n| n.to_string()));
        put(schema::ENGINE, self.engine.map(|e| e.name().into()));
        put(schema::GRAD_DIVIDE, num(self.grad_divide));
        put(schema::COMPUTE_DTYPE, self.compute_dtype.map(|d| d.name().into()));
        put(schema::ENGINE_ACCUMULATION, self.engine_accumulation.map(|n| n.to_string()));
        put(schema::WARNINGS, self.warnings.clone());
        out
    }

    /// Whether the file had a header at all.
    pub fn is_present(&self) -> bool {
        self.version.is_some()
    }
}

/// Reports show the header as a map of strings, as the file holds it.
impl serde::Serialize for TraceHeader {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.to_strings().serialize(s)
    }
}

/// The version `format` names, when this build reads it.
fn version(format: Option<&str>) -> Result<u32, String> {
    let reads = format!("{}/{}", schema::FORMAT_NAME, schema::READS.start());
    let reads = match schema::READS.start() == schema::READS.end() {
        true => reads,
        false => format!("{reads} to /{}", schema::READS.end()),
    };
    let format = format.ok_or_else(|| format!("missing; a ddp-verify trace's header names its format ({reads})"))?;
    let v = format.strip_prefix(schema::FORMAT_NAME).and_then(|v| v.strip_prefix('/')).and_then(|v| v.parse().ok());
    match v {
        Some(v) if schema::READS.contains(&v) => Ok(v),
        Some(v) if v > *schema::READS.end() => Err(format!(
            "'{format}' is newer than this ddp-verify reads ({reads}): upgrade ddp-verify (pip install -U ddp-verify)"
        )),
        _ => Err(format!("'{format}' is not a format this ddp-verify reads ({reads})")),
    }
}

/// Whether `v` parses as `value`.
fn check(value: Value, v: &str) -> Result<(), String> {
    let ok = match value {
        Value::Text => true,
        Value::Count => v.trim().parse::<usize>().is_ok_and(|n| n >= 1),
        Value::Number => v.trim().parse::<f64>().is_ok_and(f64::is_finite),
        Value::Numbers => numbers(v).is_some(),
        Value::Flag => ["true", "false"].contains(&v.to_ascii_lowercase().as_str()),
        Value::OneOf(words) => v.is_empty() || words.contains(&v),
    };
    match (ok, value) {
        (true, _) => Ok(()),
        (false, Value::OneOf(words)) => Err(format!("'{v}' is none of {}", words.join(", "))),
        (false, Value::Count) => Err(format!("'{v}' is not a whole number of at least 1")),
        (false, other) => Err(format!(
            "'{v}' is not a {}",
            match other {
                Value::Number => "finite number",
                Value::Numbers => "list of finite numbers",
                _ => "True or False",
            }
        )),
    }
}

/// Finite numbers separated by spaces, at least one.
fn numbers(v: &str) -> Option<Vec<f64>> {
    let xs: Option<Vec<f64>> = v.split_whitespace().map(|x| x.parse::<f64>().ok().filter(|x| x.is_finite())).collect();
    xs.filter(|xs| !xs.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn recorder_header() -> BTreeMap<String, String> {
        raw(&[
            ("format", "ddp-verify-trace/1"),
            ("run", "ddp"),
            ("world_size", "2"),
            ("dtype", "float32"),
            ("torch_version", "2.13.0+cpu"),
            ("steps", "4"),
            ("magnitudes", "per tensor"),
            ("framework", "accelerate"),
            ("recorded_by", "optimizer step hooks"),
            ("leg", "ddp"),
            ("acc_steps", "4"),
            ("optimizer", "AdamW"),
            ("betas", "0.9 0.999"),
            ("eps", "1e-08"),
            ("weight_decay", "0.01"),
            ("amsgrad", "False"),
            ("maximize", "False"),
            ("ddp_forward", "seen"),
        ])
    }

    #[test]
    fn a_recorder_header_reads_typed() {
        let h = TraceHeader::parse(&recorder_header()).unwrap();
        assert_eq!(h.version, Some(1));
        assert_eq!(h.run, Some(RunKind::Ddp));
        assert_eq!(h.world_size, Some(2));
        assert_eq!(h.dtype, Some(Dtype::Float32));
        assert_eq!(h.framework, Some(Framework::Accelerate));
        assert_eq!(h.optimizer.kind, Some(OptimizerKind::AdamW));
        assert_eq!(h.optimizer.betas, Some(vec![0.9, 0.999]));
        assert_eq!(h.optimizer.eps, Some(1e-8));
        assert_eq!(h.optimizer.amsgrad, Some(false));
        assert_eq!(h.magnitudes, Some(Magnitudes::PerTensor));
        assert!(h.other.is_empty());
    }

    /// Written and read back, a header is the same header.
    #[test]
    fn a_header_survives_writing_and_reading() {
        let h = TraceHeader::parse(&recorder_header()).unwrap();
        assert_eq!(TraceHeader::parse(&h.to_strings()).unwrap(), h);
        assert_eq!(TraceHeader::parse(&BTreeMap::new()).unwrap(), TraceHeader::default());
        assert!(TraceHeader::default().to_strings().is_empty());
    }

    #[test]
    fn a_missing_or_unparsable_key_is_named() {
        for (key, value, says) in [
            ("world_size", Some("garbage"), "'garbage' is not a whole number"),
            ("world_size", None, "missing"),
            ("run", Some("sideways"), "'sideways' is none of accumulation, single, ddp"),
            ("run", Some(""), "missing"),
            ("dtype", None, "missing"),
            ("betas", Some("0.9 x"), "not a list of finite numbers"),
            ("amsgrad", Some("maybe"), "not a True or False"),
            ("format", Some("ddp-verify-trace/9"), "newer than this ddp-verify reads"),
            ("format", Some("pt"), "'pt' is not a format this ddp-verify reads"),
            ("format", None, "missing"),
        ] {
            let mut r = recorder_header();
            match value {
                Some(v) => r.insert(key.into(), v.into()),
                None => r.remove(key),
            };
            let e = TraceHeader::parse(&r).unwrap_err();
            assert_eq!(e.key, key);
            assert!(e.to_string().contains(says), "{key}: {e}");
        }
    }

    #[test]
    fn unknown_keys_are_kept_and_an_empty_leg_is_none() {
        let mut r = recorder_header();
        r.insert("leg".into(), String::new());
        r.insert("future_key".into(), "x".into());
        let h = TraceHeader::parse(&r).unwrap();
        assert_eq!(h.leg, None);
        assert_eq!(h.other.get("future_key").map(String::as_str), Some("x"));
    }

    #[test]
    fn adam_family_and_sgd_are_one_definition() {
        let o = |k: &str| OptimizerRecord { kind: Some(OptimizerKind::parse(k)), ..Default::default() };
        assert!(o("AdamW").is_adam_family() && o("Adam").is_adam_family() && o("Adamax").is_adam_family());
        assert!(!o("SGD").is_adam_family() && o("SGD").is_sgd_or_unknown());
        assert!(OptimizerRecord::default().is_sgd_or_unknown() && !o("RMSprop").is_sgd_or_unknown());
    }
}
