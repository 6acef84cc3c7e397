//! `explore -- COMMAND` on a user's script: a loop that parts only where N is off a multiple
//! of W·B is found and shrunk, its cause named at the samples stage, kept and replayed; the
//! same loop dealing the one process as DistributedSampler does is never a false alarm.

use crate::util::{ddp_verify, flags, repo, stderr, stdout};

/// `explore --json --max-gpus 2` over examples/uneven with `extra` arguments to the script.
fn explore(seed: u64, cases: usize, regressions: &std::path::Path, extra: &str) -> (Option<i32>, serde_json::Value) {
    let python = repo(".venv/bin/python").display().to_string();
    let script = repo("examples/uneven/train.py").display().to_string();
    let reg = regressions.display().to_string();
    let head = format!("explore --json --max-gpus 2 --cases {cases} --seed {seed} --regressions");
    let mut args = flags(&head);
    args.extend([reg.as_str(), "--", python.as_str(), script.as_str()]);
    args.extend(flags("--samples {data_size} --batch {batch} --grad-accum {local_acc_steps}"));
    args.extend(flags(extra));
    let out = ddp_verify(&args);
    let json = serde_json::from_str(&stdout(&out)).unwrap_or_else(|e| panic!("{e}: {}{}", stdout(&out), stderr(&out)));
    (out.status.code(), json)
}

#[test]
fn a_loop_that_parts_at_uneven_n_is_found_shrunk_named_and_replayed() {
    let tmp = tempfile::tempdir().unwrap();
    let reg = tmp.path().join("regressions.txt");
    let (code, found) = explore(1, 4, &reg, "");
    assert_eq!(code, Some(1), "{found:#}");
    let smallest = &found["smallest"];
    let draw = &smallest["draw"];
    let (w, b, n) =
        (draw["gpus"].as_u64().unwrap(), draw["batch"].as_u64().unwrap(), draw["data_size"].as_u64().unwrap());
    assert_eq!(w, 2, "shrunk to the fewest ranks: {found:#}");
    assert!(!n.is_multiple_of(w * b), "parts only off a multiple of W·B: {found:#}");
    let cause = smallest["cause"].as_str().unwrap();
    assert!(cause.starts_with("the samples stage, owned by your script"), "{cause}");
    assert!(cause.contains("DistributedSampler") || cause.contains("shorter than the batch size"), "{cause}");
    let rerun = found["rerun"].as_str().unwrap();
    assert!(rerun.starts_with(&format!("ddp-verify --acc-steps {} --gpus 2", draw["acc_steps"])), "{rerun}");
    assert!(rerun.contains(&format!("--samples {n} ")), "{rerun}");
    // Kept, and replayed first next time: it fails before anything is drawn.
    let kept = std::fs::read_to_string(&reg).unwrap();
    assert_eq!(kept.lines().filter(|l| l.contains("\"command\"")).count(), 1, "{kept}");
    let (code, again) = explore(2, 1, &reg, "");
    assert_eq!((code, again["replayed"].as_u64(), again["drawn"].as_u64()), (Some(1), Some(1), Some(0)), "{again:#}");
}

#[test]
fn the_same_loop_dealt_as_distributed_sampler_does_is_never_a_false_alarm() {
    let tmp = tempfile::tempdir().unwrap();
    let (code, found) = explore(1, 3, &tmp.path().join("r.txt"), "--deal accumulation");
    assert_eq!(code, Some(0), "{found:#}");
    let cases = found["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 3);
    assert!(cases.iter().all(|c| c["ended"] == "equivalent"), "{found:#}");
    assert!(!tmp.path().join("r.txt").exists());
}

/// What explore cannot draw for is refused before any case runs (exit 2, one line).
#[test]
fn commands_explore_cannot_draw_for_are_refused() {
    let py = repo(".venv/bin/python").display().to_string();
    for (args, says) in [
        ("explore -- PY t.py --batch {batch}", "neither {acc_steps} nor {local_acc_steps}"),
        ("explore --axis lr=1,2 -- PY t.py --k {acc_steps}", "the command has no {lr}"),
        ("explore --axis seed=1,2 -- PY t.py --k {acc_steps} {seed}", "one ddp-verify fills itself"),
        ("explore --max-gpus 1 -- PY t.py --k {acc_steps}", "--max-gpus"),
        ("explore --inject no-loss-scale -- PY t.py --k {acc_steps}", "--inject"),
        ("explore --axis lr=1 --model linear --cases 1", "--axis"),
    ] {
        let line = args.replace("PY", &py);
        let out = ddp_verify(&flags(&line));
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{line}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{line}: {err}");
        assert!(err.contains(says), "{line}: {err}");
    }
}

/// A suite of the script's own cases (explore's shrunk failure kept as one): each case run
/// as `-- COMMAND`, one verdict each, with the command that reruns it.
#[test]
fn a_suite_of_script_cases_gives_each_its_verdict() {
    let tmp = tempfile::tempdir().unwrap();
    let py = repo(".venv/bin/python").display().to_string();
    let script = repo("examples/uneven/train.py").display().to_string();
    let command = format!(
        "command = [{py:?}, {script:?}, \"--samples\", \"{{data_size}}\", \"--batch\", \"{{batch}}\", \"--grad-accum\", \"{{local_acc_steps}}\"]"
    );
    let toml = format!(
        "[[case]]\nname = \"even\"\n{command}\nacc-steps = 2\ngpus = 2\nbatch-size = 2\nfills = {{ data_size = 8 }}\n\n\
         [[case]]\nname = \"uneven\"\n{command}\nacc-steps = 2\ngpus = 2\nbatch-size = 2\nfills = {{ data_size = \"6\" }}\n"
    );
    let file = tmp.path().join("gate.toml");
    std::fs::write(&file, toml).unwrap();
    let report = tmp.path().join("r.json");
    let (f, r) = (file.display().to_string(), report.display().to_string());
    let out = ddp_verify(&["suite", &f, "--report", "json", "--report-file", &r]);
    assert_eq!(out.status.code(), Some(1), "{}{}", stdout(&out), stderr(&out));
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let cases = json["cases"].as_array().unwrap();
    let verdicts: Vec<&str> = cases.iter().map(|c| c["verdict"].as_str().unwrap()).collect();
    assert_eq!(verdicts, ["equivalent", "not-equivalent"], "{json:#}");
    assert_eq!(cases[1]["diagnosis"]["reason"], "data dealt unevenly", "{json:#}");
    let rerun = cases[1]["command"].as_str().unwrap();
    assert!(rerun.starts_with("ddp-verify --acc-steps 2 --gpus 2 --batch-size 2 -- "), "{rerun}");
    assert!(rerun.contains("--samples 6 "), "{rerun}");
    // A key a script's case cannot take is refused before anything runs.
    std::fs::write(&file, format!("[[case]]\nname = \"x\"\n{command}\nmodel = \"resnet18\"\n")).unwrap();
    let out = ddp_verify(&["suite", &f]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("case 'x', key model: is not a key of a script's case"), "{}", stderr(&out));
}
