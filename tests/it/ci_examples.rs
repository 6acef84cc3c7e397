//! The CI examples people copy (examples/ci): each parses, runs the suite, keeps its JUnit
//! report even when the gate fails, and its suite command works as written.

use std::process::Command;

use serde_yaml::Value;

use crate::util::{repo, stderr};

fn yaml(path: &str) -> Value {
    serde_yaml::from_str(&std::fs::read_to_string(repo(path)).unwrap()).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The shell lines of a list of commands or steps' `run`s.
fn lines(v: &Value) -> Vec<String> {
    let text = |v: &Value| v.as_str().map(str::to_string);
    v.as_sequence().into_iter().flatten().filter_map(|s| text(s).or_else(|| text(&s["run"]))).collect()
}

/// Runs the file's suite command with this build, in a scratch directory; returns the
/// report file it names, read back.
fn run_suite(line: &str) -> String {
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words.iter().position(|w| w.ends_with("ddp-verify") && !w.contains('/') || w.ends_with("/ddp-verify"));
    let args = &words[at.expect("a ddp-verify command") + 1..];
    assert_eq!(args[0], "suite", "{line}");
    let report = args.windows(2).find(|w| w[0] == "--report-file").map(|w| w[1]).expect("a --report-file");
    let t = tempfile::tempdir().unwrap();
    let args: Vec<String> =
        args.iter().map(|a| if a.ends_with(".toml") { repo(a).display().to_string() } else { a.to_string() }).collect();
    let out = Command::new(env!("CARGO_BIN_EXE_ddp-verify")).args(&args).current_dir(t.path()).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{line}: {}", stderr(&out));
    let xml = std::fs::read_to_string(t.path().join(report)).unwrap();
    let doc = roxmltree::Document::parse(&xml).unwrap();
    assert!(doc.descendants().filter(|n| n.has_tag_name("testcase")).count() >= 10, "{xml}");
    report.to_string()
}

#[test]
fn the_github_actions_example_runs_the_suite_and_uploads_its_junit_report() {
    let doc = yaml("examples/ci/github-actions.yml");
    let job = &doc["jobs"]["equivalence"];
    assert!(job["timeout-minutes"].as_u64().unwrap() <= 30);
    let steps = job["steps"].as_sequence().unwrap();
    let runs = lines(&job["steps"]);
    assert!(runs.iter().any(|r| r.contains("scripts/setup.sh")), "{runs:?}");
    let suite = steps.iter().find(|s| s["run"].as_str().is_some_and(|r| r.contains(" suite "))).expect("a suite step");
    let report = run_suite(suite["run"].as_str().unwrap());
    let dir = suite["working-directory"].as_str().unwrap_or(".");
    let upload = steps.iter().find(|s| s["uses"].as_str().is_some_and(|u| u.starts_with("actions/upload-artifact")));
    let upload = upload.expect("an upload step");
    assert_eq!(upload["if"].as_str(), Some("always()"), "the report must be kept when the gate fails");
    assert_eq!(upload["with"]["path"].as_str(), Some(format!("{dir}/{report}").as_str()));
}

#[test]
fn the_gitlab_example_runs_the_suite_and_reports_junit() {
    let doc = yaml("examples/ci/gitlab-ci.yml");
    let job = &doc["ddp-verify"];
    let setup = lines(&job["before_script"]);
    assert!(setup.iter().any(|r| r.contains("scripts/setup.sh")), "{setup:?}");
    let script = lines(&job["script"]);
    let dir = script.iter().find_map(|l| l.strip_prefix("cd ")).unwrap_or(".");
    let report = run_suite(script.iter().find(|l| l.contains(" suite ")).expect("a suite command"));
    assert_eq!(job["artifacts"]["when"].as_str(), Some("always"), "the report must be kept when the gate fails");
    assert_eq!(job["artifacts"]["reports"]["junit"].as_str(), Some(format!("{dir}/{report}").as_str()));
}

/// `pip install ./python` builds the wheel's libtorch-free binary with its own Cargo profile,
/// whose folder is not the full build's target/release (one never replaces the other).
#[test]
fn the_wheel_builds_into_a_folder_of_its_own() {
    let read = |p: &str| -> toml::Value { toml::from_str(&std::fs::read_to_string(repo(p)).unwrap()).unwrap() };
    let profile = read("python/pyproject.toml")["tool"]["maturin"]["profile"].as_str().unwrap().to_string();
    assert!(!["release", "dev", "debug"].contains(&profile.as_str()), "{profile}");
    assert_eq!(read("Cargo.toml")["profile"][&profile]["inherits"].as_str(), Some("release"));
}

/// The release workflow (not run here): on a version tag it builds the wheel with the
/// project's own script, checks it, and publishes what that script wrote, by trusted
/// publishing.
#[test]
fn the_release_workflow_builds_the_wheel_with_its_script_and_publishes_it_on_a_tag() {
    let doc = yaml(".github/workflows/release.yml");
    let tags: Vec<&str> = doc["on"]["push"]["tags"].as_sequence().unwrap().iter().filter_map(Value::as_str).collect();
    assert_eq!(tags, ["v*"]);
    let build = &doc["jobs"]["wheel"];
    let runs = lines(&build["steps"]).join("\n");
    assert!(runs.contains("scripts/build-wheel.sh") && runs.contains("scripts/check-wheel.sh"), "{runs}");
    // What it uploads is where scripts/build-wheel.sh writes the wheel.
    let script = std::fs::read_to_string(repo("scripts/build-wheel.sh")).unwrap();
    let out = script.lines().find_map(|l| l.strip_prefix("out=")).expect("build-wheel.sh's out=");
    let steps = build["steps"].as_sequence().unwrap();
    let upload = steps.iter().find(|s| s["uses"].as_str().is_some_and(|u| u.starts_with("actions/upload-artifact")));
    let path = upload.expect("an upload step")["with"]["path"].as_str().unwrap();
    assert!(path.starts_with(&format!("{out}/ddp_verify-")) && path.ends_with(".whl"), "{path}");
    let publish = &doc["jobs"]["publish"];
    assert_eq!(publish["needs"].as_str(), Some("wheel"));
    assert_eq!(publish["permissions"]["id-token"].as_str(), Some("write"), "trusted publishing");
    let uses: Vec<&str> = publish["steps"].as_sequence().unwrap().iter().filter_map(|s| s["uses"].as_str()).collect();
    assert!(uses.iter().any(|u| u.starts_with("pypa/gh-action-pypi-publish")), "{uses:?}");
}

/// The gate over a user's own script: the wheel installed beside their torch, their script
/// run both ways with a JUnit report kept when the gate fails. Its command runs as written
/// here with nanoGPT's example for `train.py` and its arguments.
#[test]
fn the_own_script_gate_installs_the_wheel_and_its_command_runs() {
    let doc = yaml("examples/ci/own-script-github-actions.yml");
    let steps = doc["jobs"]["equivalence"]["steps"].as_sequence().unwrap();
    let runs = lines(&doc["jobs"]["equivalence"]["steps"]);
    assert!(runs.iter().any(|r| r.contains("pip install") && r.contains("ddp-verify")), "{runs:?}");
    let line = runs.iter().find(|r| r.starts_with("ddp-verify ")).expect("a ddp-verify command");
    let words: Vec<&str> = line.split_whitespace().collect();
    let report = words.windows(2).find(|w| w[0] == "--report-file").map(|w| w[1]).expect("a --report-file");
    assert!(words.windows(2).any(|w| w == ["--report", "junit"]), "{line}");
    let upload = steps.iter().find(|s| s["uses"].as_str().is_some_and(|u| u.starts_with("actions/upload-artifact")));
    let upload = upload.expect("an upload step");
    assert_eq!(upload["if"].as_str(), Some("always()"), "the report must be kept when the gate fails");
    assert_eq!(upload["with"]["path"].as_str(), Some(report));
    // Up to the user's script as written; then nanoGPT's example in its place.
    let at = words.iter().position(|w| *w == "train.py").expect("train.py");
    let torchrun = repo(".venv/bin/torchrun").display().to_string();
    let script = repo("examples/nanogpt/train.py").display().to_string();
    let mut args: Vec<String> =
        words[1..at].iter().map(|w| if *w == "torchrun" { torchrun.clone() } else { w.to_string() }).collect();
    args.extend([script, "--grad-accum".into(), "{acc_steps}".into(), "--samples".into(), "16".into()]);
    let t = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ddp-verify")).args(&args).current_dir(t.path()).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{line}: {}", stderr(&out));
    let xml = std::fs::read_to_string(t.path().join(report)).unwrap();
    let doc = roxmltree::Document::parse(&xml).unwrap();
    assert!(doc.descendants().any(|n| n.has_tag_name("testcase")), "{xml}");
}
