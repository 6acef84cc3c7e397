//! Bad input and outputs: nothing that is not ours is touched, bad input never hangs or
//! panics, and is refused before anything runs.

use std::time::Instant;

use crate::util::{ddp_verify, ddp_verify_with_ci, flags, repo, stderr};

fn tree(dir: &std::path::Path) -> Vec<String> {
    let mut all: Vec<String> =
        walk(dir).into_iter().map(|p| p.strip_prefix(dir).unwrap().display().to_string()).collect();
    all.sort();
    all
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .flat_map(|e| {
            let p = e.unwrap().path();
            let mut v = vec![p.clone()];
            if p.is_dir() {
                v.extend(walk(&p));
            }
            v
        })
        .collect()
}

#[test]
fn bless_never_touches_a_directory_or_file_that_is_not_a_golden() {
    let tmp = tempfile::tempdir().unwrap();
    let foreign = tmp.path().join("x");
    std::fs::create_dir_all(foreign.join("src")).unwrap();
    std::fs::write(foreign.join("src/m.rs"), "a").unwrap();
    let file = tmp.path().join("gf");
    std::fs::write(&file, "hi").unwrap();
    let header = tmp.path().join("h");
    std::fs::create_dir(&header).unwrap();
    std::fs::write(header.join("config.json"), "{\"someone\": \"else\"}").unwrap();
    let before = tree(tmp.path());
    for target in [&foreign, &file, &header, &tmp.path().to_path_buf()] {
        let out = ddp_verify_with_ci(&["--golden", target.to_str().unwrap(), "--bless"], None);
        assert_eq!(out.status.code(), Some(2), "{}: {}", target.display(), stderr(&out));
        assert!(stderr(&out).starts_with(&format!("ddp-verify: {}", target.display())), "{}", stderr(&out));
        assert_eq!(tree(tmp.path()), before, "{} was touched", target.display());
        assert_eq!(std::fs::read_to_string(foreign.join("src/m.rs")).unwrap(), "a");
    }
    // A new directory, then the golden it became, can be blessed.
    let fresh = tmp.path().join("new");
    for _ in 0..2 {
        let out = ddp_verify_with_ci(&["--golden", fresh.to_str().unwrap(), "--bless"], None);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert_eq!(tree(&fresh), ["accumulation.safetensors", "config.json", "ddp.safetensors"]);
    }
}

/// Rank 0 reads --init before the others wait on it: exit 2 within seconds, naming the file.
#[test]
fn a_bad_init_with_two_ranks_is_refused_within_seconds() {
    let tmp = tempfile::tempdir().unwrap();
    let text = tmp.path().join("init.txt");
    std::fs::write(&text, "not safetensors").unwrap();
    let empty = tmp.path().join("empty.safetensors");
    std::fs::write(&empty, "").unwrap();
    let sgd = repo("golden/sgd/cases.safetensors");
    let sgd = if sgd.exists() { sgd } else { text.clone() };
    for init in [&text, &empty, &sgd] {
        let started = Instant::now();
        let args = format!("--model resnet-tiny --gpus 2 --acc-steps 2 --timeout 60 --init {}", init.display());
        let out = ddp_verify(&flags(&args));
        assert_eq!(out.status.code(), Some(2), "{}: {}", init.display(), stderr(&out));
        assert!(stderr(&out).contains(&init.display().to_string()), "{}", stderr(&out));
        // Refused before training, not after it: generous, so a loaded machine passes too.
        assert!(started.elapsed().as_secs_f64() < 60.0, "{} took {:?}", init.display(), started.elapsed());
    }
    for (init, what) in [("/dev/null", "not a regular file"), ("/", "is a directory")] {
        let out = ddp_verify(&flags(&format!("--model resnet-tiny --init {init}")));
        assert_eq!(out.status.code(), Some(2));
        assert!(stderr(&out).contains(what), "{}", stderr(&out));
    }
}

#[test]
fn a_timeout_too_large_for_a_clock_is_no_timeout_not_a_panic() {
    let out = ddp_verify(&flags("--timeout 1e20"));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

/// Random values for every numeric and path flag (zero, huge, negative, NaN, garbage): the
/// parser, the lowering to a config and every check before launch answer exit 0 or a
/// one-line exit 2, never a panic.
mod fuzz {
    use proptest::prelude::*;
    use std::process::Command;

    const FLAGS: [&str; 21] = [
        "--data-size",
        "--features",
        "--gpus",
        "--acc-steps",
        "--batch-size",
        "--epochs",
        "--seed",
        "--lr",
        "--momentum",
        "--weight-decay",
        "--max-steps",
        "--image-size",
        "--classes",
        "--timeout",
        "--max-ulps",
        "--rtol",
        "--atol",
        "--dtype",
        "--model",
        "--init",
        "--golden",
    ];
    const VALUES: [&str; 18] = [
        "0",
        "1",
        "2",
        "3",
        "-1",
        "7",
        "1e20",
        "NaN",
        "inf",
        "-inf",
        "18446744073709551615",
        "1099511627776",
        "0.5",
        "x",
        "",
        "float16",
        "resnet-tiny",
        "/dev/null",
    ];

    fn args() -> impl Strategy<Value = Vec<String>> {
        let pair = (0..FLAGS.len(), 0..VALUES.len()).prop_map(|(f, v)| [FLAGS[f].to_string(), VALUES[v].to_string()]);
        (prop::collection::vec(pair, 0..5), prop_oneof![Just(""), Just("split"), Just("explore")]).prop_map(
            |(pairs, sub)| {
                let mut a: Vec<String> = if sub.is_empty() { Vec::new() } else { vec![sub.to_string()] };
                a.extend(pairs.into_iter().flatten());
                a
            },
        )
    }

    proptest! {
        #![proptest_config(crate::util::proptest_config(24))]
        #[test]
        fn random_flag_values_are_accepted_or_refused_in_one_line(a in args()) {
            accepted_or_refused_in_one_line(&a, &format!("{a:?}"))?;
        }

        /// The same values as a suite case's keys (numbers bare where TOML reads them, else
        /// strings, and switches): one line naming the case, or accepted.
        #[test]
        fn random_suite_cases_are_accepted_or_refused_in_one_line(a in args(), switch in any::<bool>()) {
            let pairs: Vec<&[String]> = a.chunks(2).filter(|p| p.len() == 2 && p[0].starts_with("--")).collect();
            let mut toml = format!("[[case]]\nname = \"fuzz\"\nshuffle = {switch}\n");
            for p in &pairs {
                let value = if p[1].parse::<i64>().is_ok() || p[1].parse::<f64>().is_ok_and(f64::is_finite) {
                    p[1].clone()
                } else {
                    format!("{:?}", p[1])
                };
                toml += &format!("{} = {value}\n", p[0].trim_start_matches("--"));
            }
            let dir = tempfile::tempdir().unwrap();
            let file = dir.path().join("suite.toml");
            std::fs::write(&file, &toml).unwrap();
            accepted_or_refused_in_one_line(&["suite".to_string(), file.display().to_string()], &toml)?;
        }
    }

    /// Exit 0, or exit 2 in one line; never a panic. `what` names the input in a failure.
    fn accepted_or_refused_in_one_line(args: &[String], what: &str) -> Result<(), TestCaseError> {
        let out = Command::new(env!("CARGO_BIN_EXE_ddp-verify-core"))
            .args(args)
            .env("DDP_VERIFY_TEST_VALIDATE_ONLY", "1")
            .output();
        let out = out.unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        prop_assert!(!err.contains("panicked"), "{what}: {err}");
        prop_assert!(matches!(out.status.code(), Some(0 | 2)), "{what}: {:?} {err}", out.status);
        if out.status.code() == Some(2) {
            prop_assert_eq!(err.trim_end().lines().count(), 1, "{}: {}", what, err);
        }
        Ok(())
    }
}

/// Where an output cannot go is said before anything runs, naming the flag; a report that
/// cannot be written at the end is a failure, not a silent pass.
#[test]
fn unwritable_outputs_are_refused_before_anything_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("f");
    std::fs::write(&file, "x").unwrap();
    let r = tmp.path().join("r.json");
    let cases: [(Vec<String>, &str); 5] = [
        (vec!["--save-trace".into(), "/proc/x".into()], "--save-trace"),
        (vec!["--save-trace".into(), file.display().to_string()], "--save-trace"),
        (vec!["--report".into(), "json".into(), "--report-file".into(), "/proc/x".into()], "--report-file"),
        (vec!["--plot".into(), "/proc/x.svg".into()], "--plot"),
        (
            flags(&format!("--report json --report-file {0} --report junit --report-file {0}", r.display()))
                .into_iter()
                .map(String::from)
                .collect(),
            "one output would overwrite the other",
        ),
    ];
    for (args, what) in cases {
        let started = Instant::now();
        let out = ddp_verify(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(what), "{args:?}: {}", stderr(&out));
        assert!(started.elapsed().as_secs_f64() < crate::util::BEFORE_ANY_RANK_S, "{args:?}");
    }
    assert!(!r.exists());
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ddp-verify")).stdout(full).output().unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
}

/// A bad flag with many ranks is found before any rank starts, and so is a W that cannot fit.
#[test]
fn many_ranks_are_validated_before_any_starts() {
    for (args, flag) in [("--gpus 64 --acc-steps 3", "--acc-steps"), ("--gpus 5000 --acc-steps 5000", "--gpus")] {
        let started = Instant::now();
        let out = ddp_verify(&flags(args));
        assert_eq!(out.status.code(), Some(2), "{args}: {}", stderr(&out));
        assert!(stderr(&out).starts_with(&format!("ddp-verify: {flag}:")), "{}", stderr(&out));
        assert!(
            started.elapsed().as_secs_f64() < crate::util::BEFORE_ANY_RANK_S,
            "{args} took {:?}",
            started.elapsed()
        );
    }
}

/// Sizes past what a tensor (or this machine) holds: one line, exit 2, before any rank starts.
#[test]
fn sizes_no_tensor_can_hold_are_refused() {
    for (args, flag) in [
        ("--model resnet-tiny --classes 18446744073709551615", "--classes"),
        ("--model resnet-tiny --classes 1000000000", "--classes"),
        ("--model resnet-tiny --image-size 1099511627776", "--data-size"),
        ("split --data-size 18446744073709551615", "--data-size"),
    ] {
        let out = ddp_verify(&flags(args));
        assert_eq!(out.status.code(), Some(2), "{args}: {}", stderr(&out));
        assert!(stderr(&out).starts_with(&format!("ddp-verify: {flag}:")), "{args}: {}", stderr(&out));
    }
}

/// `watch --trace FILE`: a file that is missing or no trace, or a command given beside it, is
/// refused in one line (exit 2), naming the flag or the file.
#[test]
fn watch_of_a_recorded_trace_refuses_what_is_no_trace() {
    let tmp = tempfile::tempdir().unwrap();
    let junk = tmp.path().join("junk.safetensors");
    std::fs::write(&junk, b"not a trace").unwrap();
    let (missing, junk) = (tmp.path().join("none.safetensors").display().to_string(), junk.display().to_string());
    for (args, says) in [
        (vec!["watch", "--trace", missing.as_str()], missing.as_str()),
        (vec!["watch", "--trace", junk.as_str()], junk.as_str()),
        (vec!["watch", "--trace", junk.as_str(), "--", "python", "train.py"], "--trace"),
    ] {
        let out = ddp_verify(&args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}
