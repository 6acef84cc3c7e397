//! Helpers: the built binary, repository paths, and golden configs as flags.

use std::path::PathBuf;
use std::process::{Command, Output};

/// Seconds within which a refusal made before any rank starts must come: far above the
/// fraction of a second it takes, far below starting thousands of ranks, so a loaded CI
/// machine passes too.
pub const BEFORE_ANY_RANK_S: f64 = 30.0;

/// What this test process computes with: the portable kernels `tests/tests.rs` pinned.
pub fn platform() -> &'static ddp_verify::spec::Platform {
    ddp_verify::dist::kernels::applied().expect("tests/tests.rs pins the kernels when the binary loads")
}

pub fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// A command of the venv the users' examples run in: the current torch release
/// (`.venv-current`, scripts/setup-current.sh; python/requirements-current.txt), as users run
/// their scripts on their own torch. The own models, the shipped corpus and the tools' other
/// tests keep torch 2.13 (`.venv`).
pub fn users(command: &str) -> String {
    repo(&format!(".venv-current/bin/{command}")).display().to_string()
}

pub fn ddp_verify(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ddp-verify")).args(args).output().expect("ddp-verify runs")
}

/// ddp-verify with the `CI` variable as given (None: unset, as on a developer's machine,
/// where --bless is allowed), whatever the test itself runs under.
pub fn ddp_verify_with_ci(args: &[&str], ci: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ddp-verify"));
    cmd.args(args).env_remove("CI");
    if let Some(v) = ci {
        cmd.env("CI", v);
    }
    cmd.output().expect("ddp-verify runs")
}

/// Flags written as one string, split on whitespace (no argument here contains a space).
pub fn flags(s: &str) -> Vec<&str> {
    s.split_whitespace().collect()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The flags that reproduce a golden case: its header's config, printed as the command
/// explore prints (one definition, held to round-trip by `cli::command_round_trip`).
pub fn golden_flags(case: &str) -> Vec<String> {
    let meta = ddp_verify::evidence::golden::read_meta(&golden_dir(case)).unwrap();
    meta.train.command().split_whitespace().skip(1).map(str::to_string).collect()
}

/// `golden/<case>`, or its directory for this CPU's vendor where it keeps one per vendor
/// (`evidence::golden::for_vendor`).
pub fn golden_dir(case: &str) -> PathBuf {
    ddp_verify::evidence::golden::for_vendor(&repo(&format!("golden/{case}")), &platform().machine.vendor).unwrap()
}

/// Every golden's directory, each vendor's where a golden keeps one per vendor.
pub fn golden_dirs() -> Vec<PathBuf> {
    use ddp_verify::evidence::golden::{vendors, VENDOR_PREFIX};
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(repo("golden"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .flat_map(|dir| match vendors(&dir) {
            v if v.is_empty() => vec![dir],
            v => v.iter().map(|name| dir.join(format!("{VENDOR_PREFIX}{name}"))).collect(),
        })
        .collect();
    dirs.sort();
    dirs
}

pub fn json_file(path: &str) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(repo(path)).unwrap()).unwrap()
}

/// proptest's config with `default_cases`, unless PROPTEST_CASES says otherwise.
pub fn proptest_config(default_cases: u32) -> proptest::test_runner::Config {
    let mut c = proptest::test_runner::Config::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        c.cases = default_cases;
    }
    c
}
