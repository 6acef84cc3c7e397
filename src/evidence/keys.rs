//! What a header key is and may hold, and `header!`: every header key as one line, from which
//! its const, its row in the key table, its typed field and its reading and writing are
//! generated, so a key cannot be added in one of those places and missed in another.
//! `HeaderValue` is what a key's Rust type must say. `schema` re-exports the rest.

use crate::spec::Dtype;

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
    OneOf(Words),
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

/// The words a header value may be, with the name of the enum they belong to (the Python class
/// of constants generated for them takes that name too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Words {
    pub class: &'static str,
    pub words: &'static [&'static str],
}

/// One header key: its name, what it holds, and whether a header must have it. Each is one
/// line of `header!` in `header.rs`, which generates this table, the const and the typed field.
#[derive(Debug, Clone, Copy)]
pub struct Key {
    pub name: &'static str,
    pub value: Value,
    /// Every header of a supported version has it; `compare` relies on it.
    pub required: bool,
    /// A setting the recorder copies from the optimizer's first param group, when present.
    pub setting: bool,
    /// The Rust const's name (`WORLD_SIZE`), which Python's `Key` class uses too.
    pub constant: &'static str,
    pub about: &'static str,
}

/// The float dtypes a trace's gradients and weights may be, by `--dtype`'s names.
pub const DTYPES: &[&str] = &["float32", "float64", "bfloat16", "float16"];

/// A type a header key may hold: the kind of string it is written as, read and written.
pub trait HeaderValue: Sized {
    /// What the string must parse as (checked, with the refusal's words, before `read`).
    const VALUE: Value;
    /// `v`, not empty and already checked against `VALUE`.
    fn read(v: &str) -> Option<Self>;
    /// As the recorder writes it.
    fn write(&self) -> String;
}

impl HeaderValue for usize {
    const VALUE: Value = Value::Count;
    fn read(v: &str) -> Option<usize> {
        v.trim().parse().ok()
    }
    fn write(&self) -> String {
        self.to_string()
    }
}

/// Written with `{:?}`, which reads back to the same float.
impl HeaderValue for f64 {
    const VALUE: Value = Value::Number;
    fn read(v: &str) -> Option<f64> {
        v.trim().parse().ok()
    }
    fn write(&self) -> String {
        format!("{self:?}")
    }
}

impl HeaderValue for Vec<f64> {
    const VALUE: Value = Value::Numbers;
    fn read(v: &str) -> Option<Vec<f64>> {
        numbers(v)
    }
    fn write(&self) -> String {
        self.iter().map(|v| format!("{v:?}")).collect::<Vec<_>>().join(" ")
    }
}

/// `True`/`False`, as Python writes them.
impl HeaderValue for bool {
    const VALUE: Value = Value::Flag;
    fn read(v: &str) -> Option<bool> {
        match v.to_ascii_lowercase().as_str() {
            "true" => Some(true),
            "false" => Some(false),
            _ => None,
        }
    }
    fn write(&self) -> String {
        if *self { "True" } else { "False" }.to_string()
    }
}

impl HeaderValue for String {
    const VALUE: Value = Value::Text;
    fn read(v: &str) -> Option<String> {
        Some(v.to_string())
    }
    fn write(&self) -> String {
        self.clone()
    }
}

/// By `--dtype`'s names.
impl HeaderValue for Dtype {
    const VALUE: Value = Value::OneOf(Words { class: "Dtype", words: DTYPES });
    fn read(v: &str) -> Option<Dtype> {
        Dtype::ALL.into_iter().find(|d| d.name() == v)
    }
    fn write(&self) -> String {
        self.name().to_string()
    }
}

/// Finite numbers separated by spaces, at least one.
pub(super) fn numbers(v: &str) -> Option<Vec<f64>> {
    let xs: Option<Vec<f64>> = v.split_whitespace().map(|x| x.parse::<f64>().ok().filter(|x| x.is_finite())).collect();
    xs.filter(|xs| !xs.is_empty())
}

/// The header's keys, one line each:
///
/// `field: Type = CONST "key" required|optional|setting "about";`
///
/// `field` may be `group.field` for the nested struct (`pub struct Group in group;`); `setting`
/// is an optional key the recorder copies from the optimizer's first param group. The `version`
/// line is the format key, read first (its own messages) into `version: Option<u32>`. Generates
/// `pub mod key` (the consts and `key::ALL`, the table in line order), both structs (each field
/// `Option<Type>`, documented by its about), and `read_keys`/`write_keys`.
macro_rules! header {
    (
        $(#[$meta:meta])*
        pub struct $header:ident {
            version = $FORMAT:ident $format:literal required $format_about:literal;
            $($($field:ident).+ : $ty:ty = $CONST:ident $key:literal $need:ident $about:literal;)+
        }
        $(#[$gmeta:meta])*
        pub struct $group_ty:ident in $group:ident;
    ) => {
        /// Every header key's name, as traces write it, and the table of them all.
        pub mod key {
            use super::*;
            use $crate::evidence::keys::{Key, Value};

            pub const $FORMAT: &str = $format;
            $(pub const $CONST: &str = $key;)+

            /// Every header key, in the order the definition lists them.
            pub(in $crate::evidence) const ALL: &[Key] = &[
                Key {
                    name: $format,
                    value: Value::Text,
                    required: true,
                    setting: false,
                    constant: stringify!($FORMAT),
                    about: $format_about,
                },
                $(Key {
                    name: $key,
                    value: <$ty as HeaderValue>::VALUE,
                    required: $crate::evidence::keys::header!(@required $need),
                    setting: $crate::evidence::keys::header!(@setting $need),
                    constant: stringify!($CONST),
                    about: $about,
                },)+
            ];
        }

        $crate::evidence::keys::header!(@structs [$(#[$meta])* $header] [$(#[$gmeta])* $group_ty $group] [] []
            $($($field).+ : $ty = $about;)+);

        impl $header {
            /// Every key's typed value from `raw`, each already checked.
            fn read_keys(&mut self, raw: &std::collections::BTreeMap<String, String>) {
                $(self.$($field).+ = raw
                    .get(key::$CONST)
                    .filter(|v| !v.is_empty())
                    .and_then(|v| <$ty as HeaderValue>::read(v));)+
            }

            /// Every key that has a value into `out`, as the recorder spells it.
            fn write_keys(&self, out: &mut std::collections::BTreeMap<String, String>) {
                $(if let Some(v) = &self.$($field).+ {
                    out.insert(key::$CONST.to_string(), HeaderValue::write(v));
                })+
            }
        }
    };

    (@required required) => { true };
    (@required optional) => { false };
    (@required setting) => { false };
    (@setting setting) => { true };
    (@setting required) => { false };
    (@setting optional) => { false };

    // Sorts the lines' fields into the header's and the group's.
    (@structs $h:tt $g:tt [$($top:tt)*] [$($in:tt)*]
        $_group:ident . $f:ident : $ty:ty = $about:literal; $($rest:tt)*) => {
        $crate::evidence::keys::header!(@structs $h $g [$($top)*] [$($in)* #[doc = $about] pub $f: Option<$ty>,] $($rest)*);
    };
    (@structs $h:tt $g:tt [$($top:tt)*] [$($in:tt)*]
        $f:ident : $ty:ty = $about:literal; $($rest:tt)*) => {
        $crate::evidence::keys::header!(@structs $h $g [$($top)* #[doc = $about] pub $f: Option<$ty>,] [$($in)*] $($rest)*);
    };
    (@structs [$(#[$meta:meta])* $header:ident] [$(#[$gmeta:meta])* $group_ty:ident $group:ident]
        [$($top:tt)*] [$($in:tt)*]) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Default)]
        pub struct $header {
            /// The format's version.
            pub version: Option<u32>,
            $($top)*
            pub $group: $group_ty,
            /// Keys this build does not know, kept as written.
            pub other: std::collections::BTreeMap<String, String>,
        }

        $(#[$gmeta])*
        #[derive(Debug, Clone, PartialEq, Default)]
        pub struct $group_ty {
            $($in)*
        }
    };
}

pub(crate) use header;
