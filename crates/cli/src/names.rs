//! The words a flag's value may be, once: the library's enums take their names from here
//! (by position), and the flags check against them so a typo is refused while parsing.

pub const MODELS: [&str; 4] = ["linear", "resnet18", "resnet-tiny", "tiny-lm"];
pub const PARTIAL_WINDOWS: [&str; 2] = ["carry", "step"];
pub const DTYPES: [&str; 4] = ["float32", "float64", "bfloat16", "float16"];
pub const OPTIMIZERS: [&str; 2] = ["sgd", "adamw"];
/// `--amp`: the autocast dtype (float32 weights, gradients and optimizer state).
pub const AMPS: [&str; 2] = ["bfloat16", "float16"];
pub const DEVICES: [&str; 3] = ["auto", "cpu", "cuda"];
/// `--kernels`: which CPU kernels libtorch computes with (see the README's "Where a golden holds").
pub const KERNELS: [&str; 2] = ["portable", "native"];
pub const FORMATS: [&str; 4] = ["table", "json", "markdown", "junit"];
/// Other spellings a report format is also known by.
pub const FORMAT_ALIASES: [(&str, &str); 1] = [("md", "markdown")];
pub const BUGS: [&str; 17] = [
    "no-loss-scale",
    "double-scale",
    "contiguous-split",
    "no-set-epoch",
    "no-padding",
    "stale-zero-grad",
    "mean-per-micro-batch",
    "count-per-rank",
    "count-before-shift",
    "last-window-by-k",
    "clip-per-micro-batch",
    "schedule-per-micro-batch",
    "adamw-no-loss-scale",
    "unsynced-param",
    "dropout-same-seed",
    "unscale-per-micro-batch",
    "scaler-update-per-micro-batch",
];

/// `s` if it is one of `names`, else the one-line complaint clap shows after the flag.
pub fn check(what: &str, s: &str, names: &[&str]) -> Result<String, String> {
    match names.contains(&s) {
        true => Ok(s.to_string()),
        false => Err(format!("unknown {what} '{s}'; known: {}", names.join(", "))),
    }
}

pub(crate) fn model(s: &str) -> Result<String, String> {
    check("model", s, &MODELS)
}

pub(crate) fn dtype(s: &str) -> Result<String, String> {
    check("dtype", s, &DTYPES)
}

pub(crate) fn device(s: &str) -> Result<String, String> {
    check("device", s, &DEVICES)
}

pub(crate) fn kernels(s: &str) -> Result<String, String> {
    check("kernel mode", s, &KERNELS)
}

pub(crate) fn partial_window(s: &str) -> Result<String, String> {
    check("partial window", s, &PARTIAL_WINDOWS)
}

pub(crate) fn optimizer(s: &str) -> Result<String, String> {
    check("optimizer", s, &OPTIMIZERS)
}

pub(crate) fn amp(s: &str) -> Result<String, String> {
    check("amp dtype", s, &AMPS)
}

pub(crate) fn bug(s: &str) -> Result<String, String> {
    check("bug", s, &BUGS)
}

/// A report format's name, its alias resolved (`md` is `markdown`).
pub fn format(s: &str) -> Result<String, String> {
    let s = FORMAT_ALIASES.iter().find(|(alias, _)| *alias == s).map_or(s, |(_, name)| name);
    check("report format", s, &FORMATS)
}
