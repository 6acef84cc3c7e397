//! A trace's header, typed: what wrote it, how many processes, K, the dtype, the optimizer
//! and its settings, the framework. Each key is one line of `header!` below (its const, its
//! row in the key table `key::ALL`, its field, reading and writing), each word one line of a
//! `vocabulary!`. A header that lacks a key `compare` relies on, or holds one that does not
//! parse, is refused naming the key. Outside `evidence`, nothing looks a header key up by string.

use std::collections::BTreeMap;

use super::keys::{header, numbers, HeaderValue, Value, FORMAT_NAME, READS};
use super::words::vocabulary;
use crate::spec::Dtype;

vocabulary! {
    /// What wrote a trace: ddp-verify's own accumulation run, the recorder's one process, or
    /// DDP (either's).
    pub enum RunKind {
        Accumulation = "accumulation",
        Single = "single",
        Ddp = "ddp",
    }
}

vocabulary! {
    /// The leg `ddp-verify -- COMMAND` ran a script as.
    pub enum Leg {
        Accumulation = "accumulation",
        Ddp = "ddp",
        BigBatch = "big-batch",
    }
}

vocabulary! {
    /// How the recorder measured each step's micro-batch magnitudes (`scale.<s>.<p>`).
    pub enum Magnitudes {
        PerElement = "true",
        PerTensor = "per tensor",
        None = "false",
    }
}

vocabulary! {
    /// The framework that called optimizer.step() in a user's run: `plain`, or one the
    /// recorder's `frameworks/` registry names (each framework's module says which Python
    /// packages are its own; `python/tests/test_engines.py` holds the two to one list).
    pub enum Framework {
        Plain = "plain",
        Transformers = "transformers",
        Lightning = "lightning",
        ColossalAi = "colossalai",
        Accelerate = "accelerate",
        DeepSpeed = "deepspeed",
    }
}

vocabulary! {
    /// What synchronised a multi-process run's gradients, as the recorder saw it.
    pub enum Engine {
        Ddp = "ddp",
        Fsdp2 = "fsdp2",
        DeepSpeed0 = "deepspeed-zero0",
        DeepSpeed1 = "deepspeed-zero1",
        DeepSpeed2 = "deepspeed-zero2",
        DeepSpeed3 = "deepspeed-zero3",
    }
}

vocabulary! {
    /// Whose items the num_items_in_batch a framework passed counts, by its own setting
    /// (Transformers' average_tokens_across_devices).
    pub enum NormaliserScope {
        World = "world",
        Rank = "rank",
    }
}

vocabulary! {
    /// Whether any DistributedDataParallel forward ran under the recorder.
    pub enum DdpForward {
        Seen = "seen",
        None = "none",
    }
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

/// Any class name: the ones not named here are `Other`.
impl HeaderValue for OptimizerKind {
    const VALUE: Value = Value::Text;
    fn read(v: &str) -> Option<OptimizerKind> {
        Some(OptimizerKind::parse(v))
    }
    fn write(&self) -> String {
        self.name().to_string()
    }
}

// One line per key: `field: Type = CONST "key" required|optional|setting "about";` (`setting`:
// copied from the optimizer's first param group). See `header!` in keys.rs.
header! {
    /// A trace file's header. `version` is None where the file has none (PyTorch's goldens, a
    /// bare safetensors file): then nothing else is known either.
    pub struct TraceHeader {
        version = FORMAT "format" required "ddp-verify-trace/<version>";
        run: RunKind = RUN "run" required "what wrote the trace: one process or DDP";
        world_size: usize = WORLD_SIZE "world_size" required "processes in the run (W under DDP)";
        dtype: Dtype = DTYPE "dtype" required "the gradients' and weights' dtype";
        leg: Leg = LEG "leg" optional "the leg ddp-verify -- COMMAND ran";
        acc_steps: usize = ACC_STEPS "acc_steps" optional "K: micro-batches per step over all ranks";
        steps_per_epoch: usize = STEPS_PER_EPOCH "steps_per_epoch" optional "optimizer steps per epoch";
        steps: usize = STEPS "steps" optional "optimizer steps recorded";
        magnitudes: Magnitudes = MAGNITUDES "magnitudes" optional "what scale.<s>.<p> holds";
        framework: Framework = FRAMEWORK "framework" optional "the framework that called optimizer.step()";
        ddp_forward: DdpForward = DDP_FORWARD "ddp_forward" optional "whether a DistributedDataParallel forward ran";
        ddp_built_by: Framework = DDP_BUILT_BY "ddp_built_by" optional
            "whose code built the DistributedDataParallel module (a framework's strategy, or the script)";
        ddp_settings: String = DDP_SETTINGS "ddp_settings" optional
            "the DistributedDataParallel module's settings that change when and what it reduces, in words";
        dropout: String = DROPOUT "dropout" optional "the dropout layers that train, in words";
        start_weights: String = START_WEIGHTS "start_weights" optional
            "a checksum of the trained weights as the first forward found them, before any backward (the same weights, the same text)";
        dropout_off: String = DROPOUT_OFF "dropout_off" optional
            "--no-dropout: the dropout the recorder made the identity (modules, calls, attention), in words";
        device_mapped: String = DEVICE_MAPPED "device_mapped" optional
            "--device cpu: the script's CUDA and NCCL calls the recorder ran on the CPU with gloo, in words";
        coupled: String = COUPLED "coupled" optional
            "the layers that mix a micro-batch's samples while training (BatchNorm), in words";
        unrecorded_optimizers: String = UNRECORDED_OPTIMIZERS "unrecorded_optimizers" optional
            "other optimizers that stepped, by class";
        written_by: String = WRITTEN_BY "written_by" optional "the tool and version that wrote it";
        recorded_by: String = RECORDED_BY "recorded_by" optional "how the recorder saw the steps";
        torch_version: String = TORCH_VERSION "torch_version" optional "the torch (or libtorch) version";
        optimizer.kind: OptimizerKind = OPTIMIZER "optimizer" optional "the stepping optimizer's class name";
        sample: usize = SAMPLE "sample" optional
            "sampled: element positions kept per tensor (absent: whole tensors)";
        parameters: usize = PARAMETERS "parameters" optional "elements in the recorded parameters, all of them";
        engine: Engine = ENGINE "engine" optional "what synchronised the ranks' gradients";
        grad_divide: f64 = GRAD_DIVIDE "grad_divide" optional
            "what the sharded engine divided the reduced gradients by (W: averaged)";
        compute_dtype: Dtype = COMPUTE_DTYPE "compute_dtype" optional
            "the forward and backward's dtype, where the engine casts the weights";
        autocast: Dtype = AUTOCAST "autocast" optional
            "the dtype torch's autocast ran the outermost forwards in (absent: off)";
        reduce_dtype: Dtype = REDUCE_DTYPE "reduce_dtype" optional
            "the dtype the gradients were reduced in where narrower than theirs (a DDP comm hook's cast: bf16_compress_hook)";
        divisor_control: f64 = DIVISOR_CONTROL "divisor_control" optional
            "a precision control run: each backward seeded by this (DDP's divisor against one process's) and each gradient divided back (DDP_VERIFY_DIVISOR)";
        engine_accumulation: usize = ENGINE_ACCUMULATION "engine_accumulation" optional
            "the engine's own gradient_accumulation_steps (DeepSpeed)";
        versions: String = VERSIONS "versions" optional
            "torch and each framework or engine library the run imported, name==version, comma-separated";
        loss_api: Framework = LOSS_API "loss_api" optional
            "the framework whose backward API took each micro-batch's loss";
        loss_handed_by: Framework = LOSS_HANDED_BY "loss_handed_by" optional
            "whose code handed the loss to that API or called backward (plain: the script)";
        backward_by: Framework = BACKWARD_BY "backward_by" optional
            "whose code called torch's backward (plain: the script)";
        zeroed_by: Framework = ZEROED_BY "zeroed_by" optional
            "whose code zeroed the gradients inside an accumulation window (plain: the script)";
        boundary_by: Framework = BOUNDARY_BY "boundary_by" optional
            "whose code marked the engine's accumulation boundaries by hand (set_gradient_accumulation_boundary)";
        first_step: usize = FIRST_STEP "first_step" optional
            "watch --stop-on-fault: the run's step that this trace of its latest steps holds as step 0";
        loss_reduction: String = LOSS_REDUCTION "loss_reduction" optional
            "how every loss backward ran on reduced its micro-batch, under its constant factors: mean or sum (absent: mixed, or no plain reduction)";
        samples_from: String = SAMPLES_FROM "samples_from" optional
            "what each sample's hash was taken from: the rows' dtype and shape (\"int64[]\", \"float32[8]\"), \"mixed\" where several";
        loss_dtype: Dtype = LOSS_DTYPE "loss_dtype" optional
            "the dtype of the values backward ran on (the losses), the narrowest where they differ";
        normalised_by: Framework = NORMALISED_BY "normalised_by" optional
            "whose code passed the forward its num_items_in_batch (plain: the script)";
        normaliser_scope: NormaliserScope = NORMALISER_SCOPE "normaliser_scope" optional
            "whose items the framework's num_items_in_batch counts, by its setting: every rank's (world) or this rank's (rank)";
        normaliser_scope_by: Framework = NORMALISER_SCOPE_BY "normaliser_scope_by" optional
            "whose choice normaliser_scope is: the script's, setting it (plain), or the framework's default";
        framework_accumulation: usize = FRAMEWORK_ACCUMULATION "framework_accumulation" optional
            "the micro-batches per step a framework's optimizer wrapper was told to accumulate";
        planned_steps: usize = PLANNED_STEPS "planned_steps" optional
            "the optimizer steps a framework planned for the run from its loader's length and its epochs (Trainer's max_steps where the script set none)";
        planned_loader: usize = PLANNED_LOADER "planned_loader" optional
            "the batches the planning framework counted in its loader each epoch, on this process";
        planned_accumulation: usize = PLANNED_ACCUMULATION "planned_accumulation" optional
            "the micro-batches per optimizer step the framework planned with";
        planned_epochs: f64 = PLANNED_EPOCHS "planned_epochs" optional
            "the epochs the framework planned the steps for";
        planned_by: Framework = PLANNED_BY "planned_by" optional
            "whose code planned the run's optimizer steps from its loader";
        sampler_dataset: usize = SAMPLER_DATASET "sampler_dataset" optional
            "samples in the data set a DistributedSampler dealt";
        sampler_padded: usize = SAMPLER_PADDED "sampler_padded" optional
            "samples DistributedSampler repeated each epoch so that its W shards are equal (drop_last=False)";
        sampler_repeated: String = SAMPLER_REPEATED "sampler_repeated" optional
            "the data set indices the first epoch's padding repeated, comma-separated (at most 16)";
        sampler_dropped: usize = SAMPLER_DROPPED "sampler_dropped" optional
            "samples DistributedSampler left out each epoch so that its W shards are equal (drop_last=True)";
        loader_dropped: usize = LOADER_DROPPED "loader_dropped" optional
            "samples per epoch the loaders' drop_last left out of their last batch, over all ranks";
        short_batches: usize = SHORT_BATCHES "short_batches" optional
            "micro-batches per epoch shorter than the loader's batch size, over all ranks";
        perturbed: f64 = PERTURBED "perturbed" optional
            "a control run: each step's gradients nudged by this fraction of each tensor's largest |g| (DDP_VERIFY_PERTURB)";
        warnings: String = WARNINGS "warnings" optional
            "what the recorder could not record (training went on), one per line";
        optimizer.betas: Vec<f64> = BETAS "betas" setting "Adam's coefficients of its running averages";
        optimizer.eps: f64 = EPS "eps" setting "what Adam adds to its denominator";
        optimizer.weight_decay: f64 = WEIGHT_DECAY "weight_decay" setting "the weight decay";
        optimizer.momentum: f64 = MOMENTUM "momentum" setting "SGD's momentum";
        optimizer.amsgrad: bool = AMSGRAD "amsgrad" setting "Adam's AMSGrad variant";
        optimizer.nesterov: bool = NESTEROV "nesterov" setting "SGD's Nesterov momentum";
        optimizer.dampening: f64 = DAMPENING "dampening" setting "SGD's dampening of its momentum";
        optimizer.maximize: bool = MAXIMIZE "maximize" setting "whether it steps up the gradient";
    }

    /// The optimizer and its first param group's settings, as recorded.
    pub struct OptimizerRecord in optimizer;
}

impl TraceHeader {
    /// Whether this trace's sample hashes can be matched against `other`'s: taken from rows
    /// of one kind (dtype and shape) in both, where both say (a trace that does not predates
    /// the fact). Hashes of other rows (a wrapper's batch ids in one leg, the model's inputs
    /// in the other) stand for nothing in common: no evidence of other samples.
    pub fn samples_comparable(&self, other: &TraceHeader) -> bool {
        match (self.samples_from.as_deref(), other.samples_from.as_deref()) {
            (Some(x), Some(y)) => x == y && x != "mixed",
            _ => true,
        }
    }
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

impl Engine {
    /// Shards parameters, gradients or optimizer state over the ranks.
    pub fn is_sharded(self) -> bool {
        match self {
            Engine::Ddp => false,
            Engine::Fsdp2 | Engine::DeepSpeed0 | Engine::DeepSpeed1 | Engine::DeepSpeed2 | Engine::DeepSpeed3 => true,
        }
    }

    /// How a loop tells this engine to skip the gradient reduction of a micro-batch.
    pub fn no_sync(self) -> &'static str {
        match self {
            Engine::Ddp => "no_sync()",
            Engine::Fsdp2 => "set_requires_gradient_sync(False)",
            Engine::DeepSpeed0 | Engine::DeepSpeed1 | Engine::DeepSpeed2 | Engine::DeepSpeed3 => {
                "DeepSpeed's gradient_accumulation_steps (engine.backward reduces at its boundary only)"
            }
        }
    }
}

impl RunKind {
    /// One process: ddp-verify's accumulation run, or the recorder's outside DDP.
    pub fn is_one_process(self) -> bool {
        match self {
            RunKind::Accumulation | RunKind::Single => true,
            RunKind::Ddp => false,
        }
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
    /// Every loss backward ran on was a mean over its micro-batch (`loss_reduction`): what
    /// its scaling must be follows from the micro-batches alone.
    pub fn loss_is_mean(&self) -> bool {
        self.loss_reduction.as_deref() == Some("mean")
    }

    /// The header of `raw` (a safetensors `__metadata__`; empty when the file has none).
    pub fn parse(raw: &BTreeMap<String, String>) -> Result<TraceHeader, HeaderProblem> {
        if raw.is_empty() {
            return Ok(TraceHeader::default());
        }
        let bad = |key: &'static str, problem: String| HeaderProblem { key, problem };
        let version = version(raw.get(key::FORMAT).map(String::as_str)).map_err(|p| bad(key::FORMAT, p))?;
        for k in key::ALL {
            // A required key written empty says no more than one left out.
            match raw.get(k.name).map(String::as_str).filter(|v| !(k.required && v.is_empty())) {
                None if k.required => {
                    let problem = format!("missing; every {} header has it", super::keys::format());
                    return Err(bad(k.name, problem));
                }
                None => {}
                Some(v) => check(k.value, v).map_err(|p| bad(k.name, p))?,
            }
        }
        let known = |name: &str| key::ALL.iter().any(|k| k.name == name);
        let other = raw.iter().filter(|(k, _)| !known(k)).map(|(k, v)| (k.clone(), v.clone())).collect();
        let mut header = TraceHeader { version: Some(version), other, ..TraceHeader::default() };
        header.read_keys(raw);
        Ok(header)
    }

    /// The header as the file holds it: string to string, in the recorder's spellings.
    pub fn to_strings(&self) -> BTreeMap<String, String> {
        let Some(version) = self.version else { return BTreeMap::new() };
        let mut out = self.other.clone();
        out.insert(key::FORMAT.to_string(), format!("{}/{version}", FORMAT_NAME));
        self.write_keys(&mut out);
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
    let reads = format!("{}/{}", FORMAT_NAME, READS.start());
    let reads = match READS.start() == READS.end() {
        true => reads,
        false => format!("{reads} to /{}", READS.end()),
    };
    let format = format.ok_or_else(|| format!("missing; a ddp-verify trace's header names its format ({reads})"))?;
    let v = format.strip_prefix(FORMAT_NAME).and_then(|v| v.strip_prefix('/')).and_then(|v| v.parse().ok());
    match v {
        Some(v) if READS.contains(&v) => Ok(v),
        Some(v) if v > *READS.end() => Err(format!(
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
        Value::OneOf(words) => v.is_empty() || words.words.contains(&v),
    };
    match (ok, value) {
        (true, _) => Ok(()),
        (false, Value::OneOf(words)) => Err(format!("'{v}' is none of {}", words.words.join(", "))),
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

    /// A valid value of each kind, as the recorder writes it: every word, both flags.
    fn valid(value: Value) -> Vec<&'static str> {
        match value {
            Value::Text => vec!["some text"],
            Value::Count => vec!["3"],
            Value::Number => vec!["0.5"],
            Value::Numbers => vec!["0.9 0.999"],
            Value::Flag => vec!["True", "False"],
            Value::OneOf(words) => words.words.to_vec(),
        }
    }

    /// Each key's const, field, reading and writing come from its one line in `header!`: the
    /// required keys plus that key, with any valid value, read into a field (nothing left in
    /// `other`) and written back as they were.
    #[test]
    fn every_key_is_read_into_its_field_and_written_back() {
        let format = super::super::keys::format();
        let required = raw(&[("format", &format), ("run", "ddp"), ("world_size", "2"), ("dtype", "float32")]);
        assert!(key::ALL.iter().filter(|k| k.required).all(|k| required.contains_key(k.name)));
        for k in key::ALL.iter().filter(|k| k.name != key::FORMAT) {
            for v in valid(k.value) {
                let mut r = required.clone();
                r.insert(k.name.into(), v.into());
                let h = TraceHeader::parse(&r).unwrap();
                assert!(h.other.is_empty(), "{}", k.name);
                assert_eq!(h.to_strings(), r, "{} = {v}", k.name);
                assert_eq!(TraceHeader::parse(&h.to_strings()).unwrap(), h, "{} = {v}", k.name);
            }
        }
    }

    /// Every vocabulary's words are distinct, and each reads back to its own variant.
    #[test]
    fn every_word_reads_back_to_its_variant() {
        macro_rules! check {
            ($($ty:ident),+) => {$(
                let names: Vec<&str> = $ty::ALL.iter().map(|v| v.name()).collect();
                assert_eq!(names, $ty::WORDS);
                assert!($ty::ALL.iter().all(|&v| $ty::parse(v.name()) == Some(v)), stringify!($ty));
                let mut distinct = names.clone();
                distinct.sort_unstable();
                distinct.dedup();
                assert_eq!(distinct.len(), names.len(), stringify!($ty));
                assert_eq!($ty::parse("no such word"), None);
            )+};
        }
        check!(RunKind, Leg, Magnitudes, Framework, Engine, DdpForward, NormaliserScope);
        assert_eq!(Magnitudes::parse("per tensor"), Some(Magnitudes::PerTensor));
        assert_eq!(Engine::DeepSpeed2.name(), "deepspeed-zero2");
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
