//! The trace format, defined once: every header key and every tensor a trace may hold, with
//! its type. `Trace::load` reads by these tables; the Python recorder writes by the module
//! generated from them (`python/ddp_verify_trace/_schema.py`, held equal to [`python_module`]
//! by a test, and the recorder's output held to it by pytest). Sharded engines and sampled
//! traces extend these tables. Nothing here needs libtorch.

/// The format's name and versions, and what a header key may hold.
pub use super::keys::{format, Key, Value, DTYPES, FORMAT_NAME, READS, VERSION};

pub const FORMAT: &str = "format";
pub const RUN: &str = "run";
pub const LEG: &str = "leg";
pub const WORLD_SIZE: &str = "world_size";
pub const ACC_STEPS: &str = "acc_steps";
pub const STEPS_PER_EPOCH: &str = "steps_per_epoch";
pub const STEPS: &str = "steps";
pub const DTYPE: &str = "dtype";
pub const MAGNITUDES: &str = "magnitudes";
pub const FRAMEWORK: &str = "framework";
pub const DDP_FORWARD: &str = "ddp_forward";
pub const DROPOUT: &str = "dropout";
pub const UNRECORDED_OPTIMIZERS: &str = "unrecorded_optimizers";
pub const WRITTEN_BY: &str = "written_by";
pub const RECORDED_BY: &str = "recorded_by";
pub const TORCH_VERSION: &str = "torch_version";
pub const OPTIMIZER: &str = "optimizer";
pub const BETAS: &str = "betas";
pub const EPS: &str = "eps";
pub const WEIGHT_DECAY: &str = "weight_decay";
pub const MOMENTUM: &str = "momentum";
pub const DAMPENING: &str = "dampening";
pub const AMSGRAD: &str = "amsgrad";
pub const NESTEROV: &str = "nesterov";
pub const MAXIMIZE: &str = "maximize";
pub const SAMPLE: &str = "sample";
pub const PARAMETERS: &str = "parameters";
pub const ENGINE: &str = "engine";
pub const GRAD_DIVIDE: &str = "grad_divide";
pub const COMPUTE_DTYPE: &str = "compute_dtype";
pub const WARNINGS: &str = "warnings";
pub const ENGINE_ACCUMULATION: &str = "engine_accumulation";

/// What `sample="auto"` chooses, as `--sample`'s help says it: defined with the flags.
pub use ddp_verify_cli::defaults::{SAMPLE_FROM_PARAMETERS, SAMPLE_SIZE};

/// What the recorder prints first on the line that says an exception stopped it (the user's
/// training going on); ddp-verify finds and quotes that line from a leg's log.
pub const STOPPED: &str = "ddp_verify_trace: recording stopped";

/// The run kinds a header names: ddp-verify's own runs, and the recorder's one process or DDP.
pub const RUNS: &[&str] = &["accumulation", "single", "ddp"];
/// The legs `ddp-verify -- COMMAND` runs a script as.
pub const LEGS: &[&str] = &["accumulation", "ddp", "big-batch"];
/// `true`: per element; `per tensor`: one number per tensor; `false`: none recorded.
pub const MAGNITUDE_KINDS: &[&str] = &["true", "per tensor", "false"];
/// Whether any DistributedDataParallel forward ran under the recorder.
pub const DDP_FORWARDS: &[&str] = &["seen", "none"];
/// The engines that synchronise a multi-process run's gradients, as the recorder saw them.
pub const ENGINES: &[&str] =
    &["ddp", "fsdp2", "deepspeed-zero0", "deepspeed-zero1", "deepspeed-zero2", "deepspeed-zero3"];

const fn key(name: &'static str, value: Value, about: &'static str) -> Key {
    Key { name, value, required: false, about }
}

const fn required(name: &'static str, value: Value, about: &'static str) -> Key {
    Key { name, value, required: true, about }
}

use Value::{Count, Flag, Number, Numbers, OneOf, Text};

/// Every header key but the optimizer's settings, in the order reports list them.
const KEYS: &[Key] = &[
    required(FORMAT, Text, "ddp-verify-trace/<version>"),
    required(RUN, OneOf(RUNS), "what wrote the trace: one process or DDP"),
    required(WORLD_SIZE, Count, "processes in the run (W under DDP)"),
    required(DTYPE, OneOf(DTYPES), "the gradients' and weights' dtype"),
    key(LEG, OneOf(LEGS), "the leg ddp-verify -- COMMAND ran"),
    key(ACC_STEPS, Count, "K: micro-batches per step over all ranks"),
    key(STEPS_PER_EPOCH, Count, "optimizer steps per epoch"),
    key(STEPS, Count, "optimizer steps recorded"),
    key(MAGNITUDES, OneOf(MAGNITUDE_KINDS), "what scale.<s>.<p> holds"),
    key(FRAMEWORK, OneOf(FRAMEWORK_NAMES), "the framework that called optimizer.step()"),
    key(DDP_FORWARD, OneOf(DDP_FORWARDS), "whether a DistributedDataParallel forward ran"),
    key(DROPOUT, Text, "the dropout layers that train, in words"),
    key(UNRECORDED_OPTIMIZERS, Text, "other optimizers that stepped, by class"),
    key(WRITTEN_BY, Text, "the tool and version that wrote it"),
    key(RECORDED_BY, Text, "how the recorder saw the steps"),
    key(TORCH_VERSION, Text, "the torch (or libtorch) version"),
    key(OPTIMIZER, Text, "the stepping optimizer's class name"),
    key(SAMPLE, Count, "sampled: element positions kept per tensor (absent: whole tensors)"),
    key(PARAMETERS, Count, "elements in the recorded parameters, all of them"),
    key(ENGINE, OneOf(ENGINES), "what synchronised the ranks' gradients"),
    key(GRAD_DIVIDE, Number, "what the sharded engine divided the reduced gradients by (W: averaged)"),
    key(COMPUTE_DTYPE, OneOf(DTYPES), "the forward and backward's dtype, where the engine casts the weights"),
    key(ENGINE_ACCUMULATION, Count, "the engine's own gradient_accumulation_steps (DeepSpeed)"),
    key(WARNINGS, Text, "what the recorder could not record (training went on), one per line"),
];

/// The optimizer settings the recorder copies from the first param group, when present,
/// with what each holds.
pub const SETTINGS: &[(&str, Value)] = &[
    (BETAS, Numbers),
    (EPS, Number),
    (WEIGHT_DECAY, Number),
    (MOMENTUM, Number),
    (AMSGRAD, Flag),
    (NESTEROV, Flag),
    (DAMPENING, Number),
    (MAXIMIZE, Flag),
];

/// Every header key: `KEYS`, then the optimizer's settings.
pub fn keys() -> impl Iterator<Item = Key> {
    let settings = SETTINGS.iter().map(|&(name, value)| key(name, value, "the first param group's setting"));
    KEYS.iter().copied().chain(settings)
}

/// Frameworks the recorder names as the caller of optimizer.step(), outermost first (the
/// Trainer steps through Accelerate: the user's is the outermost), each with the Python
/// modules that belong to it. `plain` is none of them.
pub const FRAMEWORKS: &[(&str, &[&str])] = &[
    ("transformers", &["transformers"]),
    ("lightning", &["lightning", "pytorch_lightning"]),
    ("colossalai", &["colossalai"]),
    ("accelerate", &["accelerate"]),
    ("deepspeed", &["deepspeed"]),
];
/// Every value the `framework` key may hold.
pub const FRAMEWORK_NAMES: &[&str] = &["plain", "transformers", "lightning", "colossalai", "accelerate", "deepspeed"];

/// How a tensor's name carries its step and parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// `<prefix>.<step>`
    Step,
    /// `<prefix>.<step>.<param>`
    StepParam,
    /// `<prefix>.<param>` (a parameter's or a buffer's name)
    Param,
}

/// What a tensor's elements must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elements {
    /// The trace's one float dtype (F32, F64, BF16 or F16), the same for every such tensor.
    Float,
    /// Any dtype (buffers: float statistics, int64 counters).
    Any,
    /// Any number dtype, every element finite.
    Finite,
    F64,
    I64,
}

/// What a tensor's shape must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// The parameter's own (checked against the other trace).
    Param,
    /// Exactly one element.
    One,
    /// Exactly two elements.
    Two,
    /// Exactly three elements.
    Three,
    /// One element or more (one per param group).
    Some,
    /// One dimension, not empty (one per rank, one per forward).
    Vector,
}

/// Every kind of tensor, by its name's prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Grads,
    Scale,
    Final,
    Peak,
    Buffer,
    Lr,
    Micro,
    Clips,
    Clip,
    RankBits,
    DdpSync,
    LossScale,
    FoundInf,
    Unscales,
    ScalerUpdates,
    RangePart,
    Positions,
    ParamShape,
    Summary,
    FinalSummary,
    Comm,
    Seconds,
}

/// One kind of tensor: how it is named and what it holds.
#[derive(Debug, Clone, Copy)]
pub struct TensorKind {
    pub kind: Kind,
    pub prefix: &'static str,
    pub layout: Layout,
    pub elements: Elements,
    pub shape: Shape,
    pub about: &'static str,
}

const fn kind(
    kind: Kind,
    prefix: &'static str,
    layout: Layout,
    elements: Elements,
    shape: Shape,
    about: &'static str,
) -> TensorKind {
    TensorKind { kind, prefix, layout, elements, shape, about }
}

use Elements as E;
use Layout as L;

/// Every tensor a trace may hold. A name that matches none of them is refused.
pub const TENSORS: &[TensorKind] = &[
    kind(Kind::Grads, "grads", L::StepParam, E::Float, Shape::Param, "the gradient step s applied"),
    kind(Kind::Scale, "scale", L::StepParam, E::Float, Shape::Param, "sum of the micro-batches' |gradient|"),
    kind(Kind::Final, "final", L::Param, E::Float, Shape::Param, "the final weights"),
    kind(Kind::Peak, "peak", L::Param, E::Float, Shape::Param, "each weight's largest magnitude"),
    kind(Kind::Buffer, "buffer", L::Param, E::Any, Shape::Param, "buffers at the end (BatchNorm's)"),
    kind(Kind::Lr, "lr", L::Step, E::Finite, Shape::Some, "the learning rate of each param group"),
    kind(Kind::Micro, "micro", L::Step, E::I64, Shape::One, "backward passes this rank made"),
    kind(Kind::Clips, "clips", L::Step, E::I64, Shape::One, "clip_grad_norm_ calls"),
    kind(Kind::Clip, "clip", L::Step, E::F64, Shape::Two, "the last clip's [total norm, max norm]"),
    kind(Kind::RankBits, "rank_bits", L::StepParam, E::I64, Shape::Vector, "each rank's gradient checksum"),
    kind(
        Kind::DdpSync,
        "ddp_sync",
        L::Step,
        E::I64,
        Shape::Vector,
        "per micro-batch (DDP forward, FSDP2 backward): 1 if its gradient was reduced",
    ),
    kind(Kind::Comm, "comm", L::Step, E::I64, Shape::Two, "one rank's [gradient collectives, bytes] this step"),
    kind(Kind::Seconds, "seconds", L::Step, E::Finite, Shape::One, "wall seconds since the previous step"),
    kind(Kind::LossScale, "loss_scale", L::Step, E::Finite, Shape::One, "the loss scaler's scale"),
    kind(Kind::FoundInf, "found_inf", L::Step, E::Finite, Shape::One, "1 where the scaler skipped"),
    kind(Kind::Unscales, "unscales", L::Step, E::Finite, Shape::One, "unscale_ calls (ours)"),
    kind(Kind::ScalerUpdates, "scaler_updates", L::Step, E::Finite, Shape::One, "scaler updates (ours)"),
    kind(Kind::RangePart, "range_part", L::Step, E::Finite, Shape::One, "float16's range parts the runs (ours)"),
    kind(Kind::Positions, "positions", L::Param, E::I64, Shape::Vector, "sampled: the flat positions kept, increasing"),
    kind(Kind::ParamShape, "shape", L::Param, E::I64, Shape::Vector, "sampled: the parameter's own shape"),
    kind(
        Kind::Summary,
        "summary",
        L::StepParam,
        E::F64,
        Shape::Three,
        "sampled: the whole gradient's [sum, sum of squares, max |g|]",
    ),
    kind(
        Kind::FinalSummary,
        "final_summary",
        L::Param,
        E::F64,
        Shape::Three,
        "sampled: the final weight's [sum, sum of squares, max |w|]",
    ),
];

impl Kind {
    pub fn spec(self) -> &'static TensorKind {
        TENSORS.iter().find(|t| t.kind == self).expect("every kind is in TENSORS")
    }

    /// This kind's name for `step` and `param` (either unused where the layout has none).
    pub fn name(self, step: usize, param: &str) -> String {
        let p = self.spec().prefix;
        match self.spec().layout {
            Layout::Step => format!("{p}.{step}"),
            Layout::StepParam => format!("{p}.{step}.{param}"),
            Layout::Param => format!("{p}.{param}"),
        }
    }
}

/// A tensor's name taken apart: its kind, step and parameter (where its layout has them).
#[derive(Debug, Clone)]
pub struct Name<'a> {
    pub kind: &'static TensorKind,
    pub step: usize,
    pub param: &'a str,
}

/// `name` by the table, or why it is no trace tensor.
pub fn parse_name(name: &str) -> Result<Name<'_>, String> {
    let (kind, rest) = TENSORS
        .iter()
        .find_map(|k| Some((k, name.strip_prefix(k.prefix)?.strip_prefix('.')?)))
        .ok_or_else(|| format!("unexpected tensor {name}"))?;
    let step = |s: &str| s.parse::<usize>().map_err(|_| format!("tensor {name} has no step number"));
    let (step, param) = match kind.layout {
        Layout::Step => (step(rest)?, ""),
        Layout::StepParam => {
            let (s, p) = rest.split_once('.').ok_or_else(|| format!("tensor {name} has no step number"))?;
            (step(s)?, p)
        }
        Layout::Param => (0, rest),
    };
    if kind.layout != Layout::Step && param.is_empty() {
        return Err(format!("tensor {name} names no parameter"));
    }
    Ok(Name { kind, step, param })
}

impl TensorKind {
    /// Whether a tensor of safetensors dtype `dtype` ("F32", "I64", ...), `numel` elements
    /// and `dims` dimensions may be this kind, in a trace whose float dtype is `float`; else
    /// what it should have been.
    pub fn check(&self, name: &str, dtype: &str, numel: usize, dims: usize, float: &str) -> Result<(), String> {
        const FLOATS: [&str; 4] = ["F32", "F64", "BF16", "F16"];
        let dtype_ok = match self.elements {
            E::Float => dtype == float && FLOATS.contains(&dtype),
            E::Any | E::Finite => true,
            E::F64 => dtype == "F64",
            E::I64 => dtype == "I64",
        };
        if !dtype_ok && self.elements == E::Float {
            return Err(format!("tensor {name} is {dtype}, expected one floating dtype like the rest ({float})"));
        }
        let shape_ok = match self.shape {
            Shape::Param => true,
            Shape::One => numel == 1,
            Shape::Two => numel == 2,
            Shape::Three => numel == 3,
            Shape::Some => numel >= 1,
            Shape::Vector => dims == 1 && numel >= 1,
        };
        if dtype_ok && shape_ok {
            return Ok(());
        }
        let dtype = match self.elements {
            E::F64 => " (float64)",
            E::I64 => " (int64)",
            _ => "",
        };
        let shape = match self.shape {
            Shape::One => "one value",
            Shape::Two => "two values",
            Shape::Three => "three values",
            Shape::Some => "one value or more",
            Shape::Vector | Shape::Param => "a non-empty vector",
        };
        Err(format!("tensor {name} should hold {shape}{dtype}: {}", self.about))
    }
}

/// The Python module the recorder writes by: these tables as Python literals.
pub fn python_module() -> String {
    use std::fmt::Write;
    let q = |s: &str| format!("{s:?}");
    let list = |xs: &[&str]| xs.iter().map(|x| q(x)).collect::<Vec<_>>().join(", ");
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\"\"\"The trace format ddp-verify reads, generated from src/evidence/schema.rs: do not edit.\n\n\
         Regenerate with `UPDATE_SCHEMA=1 cargo test --lib evidence::schema`; a Rust test holds this file to\n\
         the Rust tables and python/tests/test_schema.py holds what the recorder writes to this file.\n\"\"\"\n"
    );
    let _ = writeln!(out, "FORMAT = {}", q(&format()));
    let _ =
        writeln!(out, "# sample=\"auto\": whole tensors up to this many parameters, else SAMPLE_SIZE positions each");
    let _ = writeln!(out, "SAMPLE_SIZE = {SAMPLE_SIZE}\nSAMPLE_FROM_PARAMETERS = {SAMPLE_FROM_PARAMETERS}");
    let _ = writeln!(out, "# How a recording stopped by an exception says so on stderr (ddp-verify quotes the line)");
    let _ = writeln!(out, "STOPPED = {STOPPED:?}");
    let _ = writeln!(out, "\n# key: (value type, allowed values or None, required)\nHEADER = {{");
    for k in keys() {
        let allowed = match k.value {
            Value::OneOf(xs) => format!("({},)", list(xs)),
            _ => "None".into(),
        };
        let required = if k.required { "True" } else { "False" };
        let _ = writeln!(out, "    {}: ({}, {allowed}, {required}),", q(k.name), q(k.value.name()));
    }
    let settings: Vec<&str> = SETTINGS.iter().map(|(name, _)| *name).collect();
    let _ = writeln!(out, "}}\nOPTIMIZER_SETTINGS = ({},)", list(&settings));
    let _ = writeln!(out, "\n# name, outermost first: (Python modules that belong to it)\nFRAMEWORKS = {{");
    for (name, modules) in FRAMEWORKS {
        let _ = writeln!(out, "    {}: ({},),", q(name), list(modules));
    }
    let _ = writeln!(out, "}}\n\n# kind: (name pattern, elements, shape)\nTENSORS = {{");
    for t in TENSORS {
        let pattern = match t.layout {
            Layout::Step => format!("{}.{{step}}", t.prefix),
            Layout::StepParam => format!("{}.{{step}}.{{param}}", t.prefix),
            Layout::Param => format!("{}.{{param}}", t.prefix),
        };
        let _ =
            writeln!(out, "    {}: ({}, {:?}, {:?}),", q(t.prefix), q(&pattern), q_enum(t.elements), q_enum(t.shape));
    }
    let _ = writeln!(
        out,
        "}}\n\n\ndef name(kind, step=None, param=None):\n    \
         \"\"\"A tensor's name in a trace: name(\"grads\", 3, \"fc.weight\") is \"grads.3.fc.weight\".\"\"\"\n    \
         return TENSORS[kind][0].format(step=step, param=param)"
    );
    out
}

fn q_enum(v: impl std::fmt::Debug) -> String {
    format!("{v:?}").to_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Python module the recorder imports is exactly what the tables generate; on a
    /// difference `UPDATE_SCHEMA=1` rewrites it (never on CI).
    #[test]
    fn the_python_schema_is_generated_from_these_tables() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("python/ddp_verify_trace/_schema.py");
        let want = python_module();
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        if have == want {
            return;
        }
        match std::env::var("UPDATE_SCHEMA").as_deref() {
            Ok("1") if std::env::var_os("CI").is_none() => std::fs::write(&path, want).unwrap(),
            Ok("1") => panic!("UPDATE_SCHEMA is refused on CI: regenerate {} locally and commit it", path.display()),
            _ => panic!(
                "{} is not what src/evidence/schema.rs generates: run `UPDATE_SCHEMA=1 cargo test --lib \
                 evidence::schema` and commit it",
                path.display()
            ),
        }
    }

    #[test]
    fn every_kind_names_and_parses_back() {
        for t in TENSORS {
            let name = t.kind.name(3, "layer.0.weight");
            let parsed = parse_name(&name).unwrap();
            assert_eq!(parsed.kind.kind, t.kind, "{name}");
            if t.layout != Layout::Param {
                assert_eq!(parsed.step, 3, "{name}");
            }
            if t.layout != Layout::Step {
                assert_eq!(parsed.param, "layer.0.weight", "{name}");
            }
        }
    }

    #[test]
    fn prefixes_that_start_alike_are_told_apart() {
        assert_eq!(parse_name("clips.2").unwrap().kind.kind, Kind::Clips);
        assert_eq!(parse_name("clip.2").unwrap().kind.kind, Kind::Clip);
        assert_eq!(parse_name("scale.0.w").unwrap().kind.kind, Kind::Scale);
        assert_eq!(parse_name("scaler_updates.0").unwrap().kind.kind, Kind::ScalerUpdates);
        assert_eq!(parse_name("final_summary.w").unwrap().kind.kind, Kind::FinalSummary);
        assert_eq!(parse_name("final.w").unwrap().kind.kind, Kind::Final);
        assert!(parse_name("grads.x.w").unwrap_err().contains("has no step number"));
        assert!(parse_name("weights.w").unwrap_err().contains("unexpected tensor weights.w"));
        assert!(parse_name("final.").unwrap_err().contains("names no parameter"));
    }

    /// Counts of any shape with one element pass; empty vectors and other dtypes are refused
    /// naming what the tensor should hold.
    #[test]
    fn a_tensor_is_checked_against_its_kind() {
        let check =
            |name: &str, dtype, numel, dims| parse_name(name).unwrap().kind.check(name, dtype, numel, dims, "F32");
        assert!(check("micro.0", "I64", 1, 2).is_ok() && check("grads.0.w", "F32", 6, 2).is_ok());
        assert!(check("rank_bits.0.w", "I64", 0, 1).unwrap_err().contains("should hold a non-empty vector (int64)"));
        assert!(check("clip.0", "F32", 2, 1).unwrap_err().contains("should hold two values (float64)"));
        assert!(check("grads.0.w", "F64", 6, 2)
            .unwrap_err()
            .contains("expected one floating dtype like the rest (F32)"));
    }

    /// The schema's dtypes are `--dtype`'s, by the same names.
    #[test]
    fn the_trace_dtypes_are_the_flags() {
        let flags: Vec<&str> = crate::spec::Dtype::ALL.iter().map(|d| d.name()).collect();
        assert_eq!(DTYPES, flags.as_slice());
    }

    #[test]
    fn every_key_is_listed_once() {
        let mut names: Vec<&str> = keys().map(|k| k.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), keys().count());
        let mut fw: Vec<&str> = FRAMEWORKS.iter().map(|(f, _)| *f).chain(["plain"]).collect();
        fw.sort_unstable();
        let mut names = FRAMEWORK_NAMES.to_vec();
        names.sort_unstable();
        assert_eq!(fw, names);
    }
}
