//! Exit codes, bad input, files written and not written, and the launch modes.

use std::process::Command;

use crate::util::{ddp_verify, json_file, repo, stderr, stdout};

/// Bad input: exit 2, one line naming the flag or file, nothing on stdout.
fn assert_refused(args: &[&str], names: &str) {
    let out = ddp_verify(args);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
    assert!(err.starts_with("ddp-verify: ") && err.contains(names), "{args:?}: {err}");
    assert!(stdout(&out).is_empty());
}

#[test]
fn bad_flags_exit_2_with_one_line_naming_the_flag_and_the_fix() {
    assert_refused(&["--acc-steps", "3", "--gpus", "2"], "--acc-steps: 3 is not a multiple of --gpus 2");
    assert_refused(&["--gpus", "0"], "--gpus");
    assert_refused(&["--batch-size", "0"], "--batch-size");
    // N < W pads by repetition as torch does; with drop_last every shard is empty.
    assert_refused(&["--data-size", "1", "--gpus", "2", "--drop-last"], "--drop-last");
    assert_refused(
        &["--data-size", "4", "--batch-size", "4", "--acc-steps", "4", "--epochs", "1"],
        "no optimizer step",
    );
    assert_refused(&["--lr", "inf"], "--lr");
    assert_refused(&["split", "--acc-steps", "3", "--gpus", "2"], "--acc-steps");
    assert_refused(&["--data-size", "100000000", "--features", "100000"], "GiB");
}

#[test]
fn missing_mismatched_or_corrupt_goldens_exit_2_before_anything_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let trace_dir = tmp.path().join("trace");
    let t = trace_dir.to_str().unwrap();
    assert_refused(&["--golden", "/no/such/golden", "--save-trace", t], "--golden");
    let w3 = repo("golden/w3");
    assert_refused(&["--golden", w3.to_str().unwrap(), "--save-trace", t], "golden was made with --acc-steps 3");
    let bad = tmp.path().join("bad");
    std::fs::create_dir(&bad).unwrap();
    for f in ["config.json", "ddp.safetensors"] {
        std::fs::copy(repo("golden/article").join(f), bad.join(f)).unwrap();
    }
    let truncated = std::fs::read(repo("golden/article/accumulation.safetensors")).unwrap();
    std::fs::write(bad.join("accumulation.safetensors"), &truncated[..truncated.len() / 2]).unwrap();
    assert_refused(&["--golden", bad.to_str().unwrap(), "--save-trace", t], "accumulation.safetensors");
    // Wrong shape, then wrong name, in an otherwise valid golden.
    std::fs::copy(repo("golden/article/accumulation.safetensors"), bad.join("accumulation.safetensors")).unwrap();
    let ddp = tch::Tensor::read_safetensors(repo("golden/article/ddp.safetensors")).unwrap();
    let reshaped: Vec<(String, tch::Tensor)> = ddp
        .iter()
        .map(|(n, t)| {
            (
                n.clone(),
                if n == "final.linear.weight" { tch::Tensor::zeros([1, 7], tch::kind::FLOAT_CPU) } else { t.copy() },
            )
        })
        .collect();
    tch::Tensor::write_safetensors(&reshaped, bad.join("ddp.safetensors")).unwrap();
    assert_refused(&["--golden", bad.to_str().unwrap(), "--save-trace", t], "the model has");
    let renamed: Vec<(String, tch::Tensor)> =
        ddp.iter().map(|(n, t)| (n.replace("linear.", "fc."), t.copy())).collect();
    tch::Tensor::write_safetensors(&renamed, bad.join("ddp.safetensors")).unwrap();
    assert_refused(&["--golden", bad.to_str().unwrap(), "--save-trace", t], "fc.weight");
    std::fs::write(bad.join("config.json"), "{not json").unwrap();
    assert_refused(&["--golden", bad.to_str().unwrap(), "--save-trace", t], "config.json");
    assert!(!trace_dir.exists(), "a refused run wrote its trace");
}

#[test]
fn save_trace_writes_the_pytorch_layout_and_refuses_to_overwrite_without_force() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("trace");
    let d = dir.to_str().unwrap();
    let out = ddp_verify(&["--save-trace", d]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    for run in ["accumulation", "ddp"] {
        let tensors = tch::Tensor::read_safetensors(dir.join(format!("{run}.safetensors"))).unwrap();
        let mut names: Vec<String> = tensors.into_iter().map(|(n, _)| n).collect();
        names.sort();
        let mut want =
            vec!["final.linear.weight", "grads.0.linear.weight", "grads.1.linear.weight", "peak.linear.weight"];
        if run == "ddp" {
            // Each step's all-reduces and their bytes (the report's cost).
            want.extend(["comm.0", "comm.1"]);
            want.sort();
        }
        assert_eq!(names, want);
    }
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap()).unwrap();
    assert_eq!(report["verdict"], "equivalent");
    assert_eq!(report["config"]["acc_steps"], 2);
    assert_eq!(report["runs"]["steps"].as_array().unwrap().len(), 2);

    assert_refused(&["--save-trace", d], "--force");
    let out = ddp_verify(&["--save-trace", d, "--force"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn split_json_gives_torchs_shards_and_the_accumulation_order() {
    let cases = json_file("golden/sampler/cases.json");
    let case = cases["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| {
            c["shuffle"] == true && c["drop_last"] == false && c["data_size"] == 17 && c["gpus"] == 3 && c["epoch"] == 3
        })
        .unwrap();
    let seed = case["seed"].to_string();
    let out = ddp_verify(&[
        "split",
        "--data-size",
        "17",
        "--gpus",
        "3",
        "--batch-size",
        "3",
        "--acc-steps",
        "6",
        "--shuffle",
        "--seed",
        &seed,
        "--epoch",
        "3",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let plan: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(plan["shards"], case["shards"]);
    assert_eq!(plan["accumulation_order"], case["accumulation_order"]);
}

#[test]
fn split_text_names_every_rank_and_each_step() {
    let out = ddp_verify(&["split", "--data-size", "10", "--gpus", "3", "--batch-size", "3", "--acc-steps", "3"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0));
    assert!(text.contains("rank 2: [2, 5, 8, 1]"), "{text}");
    assert!(text.contains("step 0: [0, 3, 6] (rank 0)  [1, 4, 7] (rank 1)  [2, 5, 8] (rank 2)"), "{text}");
}

#[test]
fn under_a_users_mpirun_each_process_is_a_rank_and_rank_0_reports() {
    let out = Command::new("mpirun")
        .args(["-np", "2", "--bind-to", "none", env!("CARGO_BIN_EXE_ddp-verify"), "--golden"])
        .arg(repo("golden/article"))
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .output()
        .unwrap();
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}{}", stderr(&out));
    assert_eq!(text.matches("\nEQUIVALENT").count(), 1, "{text}");
}

#[test]
fn a_missing_mpirun_is_a_launcher_failure_with_exit_3() {
    let out = Command::new(env!("CARGO_BIN_EXE_ddp-verify")).env("PATH", "/nonexistent").output().unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("mpirun is not on PATH") && err.contains("openmpi-bin"), "{err}");
}

use crate::util::ddp_verify_with_ci as run_env;

#[test]
fn bless_records_a_golden_that_later_runs_check_and_ci_never_writes_one() {
    let tmp = tempfile::tempdir().unwrap();
    let g = tmp.path().join("goldens/mine");
    let gs = g.to_str().unwrap();
    let flags = ["--data-size", "12", "--batch-size", "2", "--golden", gs];

    let refused = run_env(&[&flags[..], &["--bless"]].concat(), Some("true"));
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    assert!(stderr(&refused).contains("CI"), "{}", stderr(&refused));
    assert!(!g.exists(), "CI wrote a golden");

    let missing = run_env(&flags, None);
    assert_eq!(missing.status.code(), Some(2));
    assert!(stderr(&missing).contains("--bless"), "the error should say how to record one: {}", stderr(&missing));

    let blessed = run_env(&[&flags[..], &["--bless"]].concat(), None);
    assert_eq!(blessed.status.code(), Some(0), "{}", stderr(&blessed));
    let header: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(g.join("config.json")).unwrap()).unwrap();
    assert_eq!(header["made_by"], "ddp-verify --bless");
    for key in ["tool_version", "torch_version", "dtype", "device", "date"] {
        assert!(header[key].is_string(), "header lacks {key}: {header}");
    }
    let leftovers: Vec<_> = std::fs::read_dir(g.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(leftovers, ["mine"], "temporary directories left behind");

    let checked = run_env(&flags, Some("true"));
    assert_eq!(checked.status.code(), Some(0), "{}", stderr(&checked));
    assert!(stdout(&checked).contains("ddp          vs golden ddp"), "{}", stdout(&checked));

    // A golden from another libtorch is refused, not compared.
    let header_text = std::fs::read_to_string(g.join("config.json")).unwrap();
    let old = header_text.replace(header["torch_version"].as_str().unwrap(), "2.12.0");
    std::fs::write(g.join("config.json"), old).unwrap();
    let other = run_env(&flags, None);
    assert_eq!(other.status.code(), Some(2));
    assert!(stderr(&other).contains("torch 2.12.0") && stderr(&other).contains("--bless"), "{}", stderr(&other));
}

#[test]
fn report_files_are_written_once_and_never_overwritten_without_force() {
    let tmp = tempfile::tempdir().unwrap();
    let junit = tmp.path().join("ddp.xml");
    let md = tmp.path().join("ddp.md");
    let (j, m) = (junit.to_str().unwrap(), md.to_str().unwrap());
    let args =
        ["--report", "junit", "--report-file", j, "--report", "markdown", "--report-file", m, "--report", "table"];
    let out = ddp_verify(&args);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("\nEQUIVALENT"), "the table goes to stdout");
    roxmltree::Document::parse(&std::fs::read_to_string(&junit).unwrap()).unwrap();
    assert!(std::fs::read_to_string(&md).unwrap().starts_with("### ddp-verify: ✅ EQUIVALENT"));
    assert_refused(&args, "--force");
    let forced = ddp_verify(&[&args[..], &["--force"]].concat());
    assert_eq!(forced.status.code(), Some(0));
    assert_refused(&["--report", "yaml"], "yaml");
}

#[test]
fn two_identical_runs_write_bit_identical_traces() {
    let tmp = tempfile::tempdir().unwrap();
    let flags =
        ["--data-size", "24", "--batch-size", "2", "--acc-steps", "6", "--gpus", "3", "--shuffle", "--epochs", "2"];
    for run in ["a", "b"] {
        let dir = tmp.path().join(run);
        let out = ddp_verify(&[&flags[..], &["--save-trace", dir.to_str().unwrap()]].concat());
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    for file in ["accumulation.safetensors", "ddp.safetensors"] {
        let a = std::fs::read(tmp.path().join("a").join(file)).unwrap();
        let b = std::fs::read(tmp.path().join("b").join(file)).unwrap();
        assert!(a == b, "{file} differs between two identical runs");
    }
}

#[test]
fn a_bad_flag_on_a_run_the_front_starts_is_one_line_and_exit_2() {
    let out = ddp_verify(&["--model", "resnet-tiny", "--bogus", "1"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("--bogus"), "{err}");
}

mod command_round_trip {
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(crate::util::proptest_config(64))]

        /// The command explore prints for a (shrunk) configuration reproduces it: parsed by the
        /// same flags and lowered by the same code as a user's, it gives the same config back,
        /// planted bug included.
        #[test]
        fn a_printed_command_lowers_to_the_config_it_was_printed_from(
            cfg in ddp_verify::jobs::explore::models::strategy(
                3,
                &[ddp_verify::spec::ModelKind::Linear, ddp_verify::spec::ModelKind::ResnetTiny, ddp_verify::spec::ModelKind::TinyLm],
            ),
            bug in proptest::option::of(proptest::sample::select(ddp_verify::spec::Bug::ALL.to_vec())),
        ) {
            use ddp_verify_cli::{Cli, Parser};
            let (mut cfg, model) = (cfg.clone(), cfg.model.kind);
            ddp_verify::jobs::explore::models::plant(&mut cfg, bug.filter(|b| b.applies_to(model)));
            let command = cfg.command();
            let cli = Cli::try_parse_from(command.split_whitespace().chain(["--device", "cpu"]))
                .map_err(|e| TestCaseError::fail(format!("{command}: {e}")))?;
            let lowered = ddp_verify::lower::verification(&cli.run)
                .map_err(|e| TestCaseError::fail(format!("{command}: {e}")))?;
            prop_assert_eq!(&lowered.train, &cfg, "{}", command);
        }
    }
}

/// Every golden's header, printed as a command and lowered back, is the config it records:
/// the flags the golden tests pass (`util::golden_flags`) reproduce the golden's run.
#[test]
fn every_goldens_config_is_reproduced_by_its_printed_command() {
    use ddp_verify_cli::{Cli, Parser};
    let mut seen = 0;
    for dir in crate::util::golden_dirs() {
        let Ok(meta) = ddp_verify::evidence::golden::read_meta(&dir) else { continue };
        let command = meta.train.command();
        let cli = Cli::try_parse_from(command.split_whitespace().chain(["--device", "cpu"])).expect(&command);
        let lowered = ddp_verify::lower::verification(&cli.run).expect(&command);
        let mut want = meta.train.clone();
        want.run.shared_gpus = None;
        assert_eq!(lowered.train, want, "{}: {command}", dir.display());
        seen += 1;
    }
    assert!(seen >= 20, "only {seen} goldens read");
}

#[test]
fn every_help_names_the_command_the_user_typed() {
    // The core parses what `ddp-verify` hands it; its own file name must not show.
    for args in [&["--help"][..], &["explore", "--help"], &["split", "--help"], &["devices", "--help"]] {
        let out = Command::new(env!("CARGO_BIN_EXE_ddp-verify")).args(args).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        assert!(text.contains("Usage: ddp-verify "), "{args:?}: {text}");
        assert!(!text.contains("ddp-verify-core"), "{args:?}: {text}");
    }
}
