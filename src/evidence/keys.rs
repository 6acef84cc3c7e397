//! What a header key is and may hold, and the format's name and versions. `schema`
//! re-exports all of it.

/// What every trace's `format` key starts with; the version follows the slash.
pub const FORMAT_NAME: &str = "ddp-verify-trace";
/// The version written now: 2 adds sampled traces (`sample`, `positions.*`, `summary.*`).
pub const VERSION: u32 = 2;
/// The versions this build reads: 1 is the layout of ddp-verify 0.1 and the recorder 0.2.
pub const READS: std::ops::RangeInclusive<u32> = 1..=VERSION;

/// `ddp-verify-trace/<VERSION>`, as headers write it.
pub fn format() -> String {
    format!("{FORMAT_NAME}/{VERSION}")
}

/// What a header value must parse as. Safetensors headers are string to string; these are
/// what the strings hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value {
    /// Free text, shown as it is.
    Text,
    /// A whole number >= 1.
    Count,
    /// A finite number.
    Number,
    /// Finite numbers separated by spaces (a tuple of settings, `betas`).
    Numbers,
    /// `True` or `False` (as Python writes them; `true`/`false` also read).
    Flag,
    /// One of these words; the empty string reads as absent.
    OneOf(&'static [&'static str]),
}

impl Value {
    /// What `_schema.py` calls it.
    pub fn name(self) -> &'static str {
        match self {
            Value::Text => "text",
            Value::Count => "count",
            Value::Number => "number",
            Value::Numbers => "numbers",
            Value::Flag => "flag",
            Value::OneOf(_) => "one of",
        }
    }
}

/// One header key: its name, what it holds, and whether a header must have it.
#[derive(Debug, Clone, Copy)]
pub struct Key {
    pub name: &'static str,
    pub value: Value,
    /// Every header of a supported version has it; `compare` relies on it.
    pub required: bool,
    pub about: &'static str,
}

/// The float dtypes a trace's gradients and weights may be, by `--dtype`'s names.
pub const DTYPES: &[&str] = &["float32", "float64", "bfloat16", "float16"];
