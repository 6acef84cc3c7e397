//! `ddp-verify watch -- COMMAND`: the user's launch command run once, as written, and judged
//! by each stage's contract. Honest examples keep every contract; a planted bug breaks one at
//! its stage; the run's own failure is exit 3; bad usage exit 2.

use crate::util::{ddp_verify, repo, stderr, stdout, users};

/// Runs `example` once under `watch` through torchrun over `w` processes; (exit code, the
/// JSON report, the other reports' texts by format). A run that fails once (torchrun's
/// rendezvous on a loaded machine) runs again.
fn watched(example: &str, w: usize, args: &[&str], formats: &[&str]) -> (Option<i32>, serde_json::Value, Vec<String>) {
    let t = tempfile::tempdir().unwrap();
    let py = users("python");
    let script = repo(&format!("examples/{example}/train.py")).display().to_string();
    let report = t.path().join("report.json").display().to_string();
    let files: Vec<String> =
        formats.iter().map(|f| t.path().join(format!("report.{f}")).display().to_string()).collect();
    let n = w.to_string();
    let mut argv: Vec<&str> = vec!["watch", "--report", "json", "--report-file", &report];
    for (f, file) in formats.iter().zip(&files) {
        argv.extend(["--report", f, "--report-file", file]);
    }
    argv.extend(["--", &py, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", &n, &script]);
    argv.extend(args);
    let mut out = ddp_verify(&argv);
    if out.status.code() == Some(3) {
        eprintln!("{example} {args:?}: the run failed once, running again:\n{}", stderr(&out));
        out = ddp_verify(&argv);
    }
    let text = std::fs::read_to_string(&report).unwrap_or_else(|e| panic!("{e}: {}{}", stdout(&out), stderr(&out)));
    let rendered = files.iter().map(|f| std::fs::read_to_string(f).unwrap()).collect();
    (out.status.code(), serde_json::from_str(&text).unwrap(), rendered)
}

fn held(r: &serde_json::Value, stage: &str) -> String {
    let c = r["contracts"].as_array().unwrap().iter().find(|c| c["stage"] == stage).unwrap();
    c["held"].as_str().unwrap().to_string()
}

/// Honest DDP loops, FSDP2 and a framework's, each one run: every contract checked holds,
/// the samples, scaling and reduction among them.
#[test]
fn honest_runs_keep_every_contract() {
    for (example, w, args) in [
        ("nanogpt", 2, &["--grad-accum", "4"][..]),
        ("nanogpt", 3, &["--grad-accum", "6"][..]),
        ("fsdp2", 2, &["--grad-accum", "4", "--bf16"][..]),
        ("transformers", 2, &["--grad-accum", "2", "--batch", "4", "--dropout", "0.1"][..]),
    ] {
        let (code, r, _) = watched(example, w, args, &[]);
        assert_eq!(code, Some(0), "{example} {args:?}: {r}");
        assert_eq!(r["verdict"], "equivalent", "{r}");
        for stage in ["samples", "scaling", "reduction"] {
            assert_eq!(held(&r, stage), "held", "{example} {args:?}: {stage}: {r}");
        }
        assert!(r["not_checked"].as_str().unwrap().contains("no reference run"), "{r}");
    }
}

/// Planted bugs break the contract of their stage at step 0, with the advice of the two-run
/// check; every format says the stage.
#[test]
fn a_planted_bug_breaks_its_stages_contract_in_one_run() {
    let (code, r, texts) =
        watched("nanogpt", 2, &["--grad-accum", "4", "--bug", "sync-after-forward"], &["table", "markdown", "junit"]);
    assert_eq!(code, Some(1), "{r}");
    let d = &r["fault"]["diagnosis"];
    assert_eq!((r["fault"]["step"].as_u64(), d["stage"].as_str()), (Some(0), Some("reduction")), "{r}");
    assert_eq!(d["reason"], "unsynchronised gradient", "{r}");
    assert_eq!(held(&r, "reduction"), "broken", "{r}");
    for t in &texts {
        assert!(t.contains("reduction") && t.contains("step 0"), "{t}");
    }
    assert!(texts[2].contains("<failure"), "{}", texts[2]);
    // A loss divided by K on every rank: half what each of a rank's 2 micro-batches needs.
    let (code, r, _) = watched("accelerate", 2, &["--grad-accum", "2", "--bug", "divide-by-k"], &[]);
    assert_eq!(code, Some(1), "{r}");
    let d = &r["fault"]["diagnosis"];
    assert_eq!(d["stage"], "scaling", "{r}");
    assert!(d["detail"].as_str().unwrap().contains("2.00x smaller"), "{r}");
}

/// The run failing by itself is exit 3 naming it; a command that is missing, or a trace
/// folder already used, is exit 2 naming the flag.
#[test]
fn a_failed_run_and_bad_usage_are_named() {
    let t = tempfile::tempdir().unwrap();
    let py = users("python");
    let out = ddp_verify(&["watch", "--", &py, "-c", "raise SystemExit('no training here')"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("no training here"), "{}", stderr(&out));
    let out = ddp_verify(&["watch"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    std::fs::write(t.path().join("watch.safetensors"), b"x").unwrap();
    let dir = t.path().display().to_string();
    let out = ddp_verify(&["watch", "--save-trace", &dir, "--", &py, "-c", "pass"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--force"), "{}", stderr(&out));
}

/// `--stop-on-fault`: a run of 160 steps whose reduction breaks at step 0 is stopped long
/// before its end, every process gone, the fault named at step 0; an honest run trains to
/// its end and keeps every contract.
#[test]
fn stop_on_fault_stops_every_rank_at_the_first_broken_step() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().display().to_string();
    let py = users("python");
    let script = repo("examples/nanogpt/train.py").display().to_string();
    let run = |bug: &[&str]| {
        let report = t.path().join("r.json").display().to_string();
        let mut argv = vec!["watch", "--stop-on-fault", "--force", "--save-trace", &dir, "--report", "json"];
        argv.extend(["--report-file", &report, "--", &py, "-m", "torch.distributed.run", "--standalone"]);
        argv.extend(["--nproc_per_node", "2", &script, "--grad-accum", "4", "--epochs", "40"]);
        argv.extend(bug);
        let out = ddp_verify(&argv);
        let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
        (out, r)
    };
    let (out, r) = run(&["--bug", "sync-after-forward"]);
    assert_eq!(out.status.code(), Some(1), "{}{}", stdout(&out), stderr(&out));
    assert_eq!(r["fault"]["step"], 0, "{r}");
    let note = r["notes"][0].as_str().unwrap_or_default();
    assert!(note.contains("--stop-on-fault: the run was stopped after"), "{r}");
    assert!(r["steps"].as_u64().unwrap() < 160, "not stopped early: {r}");
    // Every rank named in the note is gone.
    for pid in note.split("(pid ").skip(1).filter_map(|p| p.split(')').next()) {
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "pid {pid} still runs: {note}");
    }
    let (out, r) = run(&[]);
    assert_eq!(out.status.code(), Some(0), "{}{}", stdout(&out), stderr(&out));
    assert_eq!(r["steps"], 160, "{r}");
}
