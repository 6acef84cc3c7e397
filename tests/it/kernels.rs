//! The same verdict on every machine: goldens made with the portable kernels, refused where
//! their bits cannot hold, and no verdict (exit 4) where this machine's kernels do not
//! repeat themselves.

use std::path::Path;

use crate::util::{ddp_verify, flags, golden_flags, json_file, repo, stderr, stdout};

/// Every golden header says where and how it was made, and every golden was made portably,
/// so every test that compares bits compares bits made the same way on any machine.
#[test]
fn every_golden_was_made_with_the_portable_kernels_and_says_where() {
    let mut headers = 0;
    for dir in crate::util::golden_dirs() {
        // The sampler's cases are indices: no kernel computes them.
        if dir.ends_with("sampler") {
            continue;
        }
        for file in ["config.json", "cases.json", "tiny/config.json"] {
            let path = dir.join(file);
            if !path.exists() {
                continue;
            }
            headers += 1;
            let meta: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            let k = &meta["kernels"];
            assert_eq!(k["mode"], "portable", "{}", path.display());
            assert_eq!(
                (&k["cpu_capability"], &k["onednn"], &k["mkl_cbwr"]),
                (&"AVX2".into(), &false.into(), &"COMPATIBLE".into()),
                "{}",
                path.display()
            );
            assert_eq!(k["threads"], 1, "{}", path.display());
            for key in ["cpu", "vendor"] {
                assert!(
                    meta["machine"][key].as_str().is_some_and(|s| !s.is_empty()),
                    "{} machine.{key}",
                    path.display()
                );
            }
            // A golden kept per vendor was made on a CPU of the vendor it is kept for.
            let kept_for = dir.file_name().unwrap().to_str().unwrap().strip_prefix("vendor-");
            if let Some(vendor) = kept_for {
                assert_eq!(meta["machine"]["vendor"], vendor, "{}", path.display());
            }
        }
    }
    assert!(headers >= 30, "{headers} golden headers");
}

/// A copy of golden/article whose header is edited by `edit`.
fn edited_article(edit: impl FnOnce(&mut serde_json::Value)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in ["accumulation.safetensors", "ddp.safetensors"] {
        std::fs::copy(repo("golden/article").join(f), dir.path().join(f)).unwrap();
    }
    let mut meta = json_file("golden/article/config.json");
    edit(&mut meta);
    std::fs::write(dir.path().join("config.json"), serde_json::to_string_pretty(&meta).unwrap()).unwrap();
    dir
}

fn run_with_golden(dir: &Path, extra: &[&str]) -> std::process::Output {
    let golden = dir.display().to_string();
    let mut args = golden_flags("article");
    args.extend(["--golden".to_string(), golden]);
    args.extend(extra.iter().map(|s| s.to_string()));
    ddp_verify(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

fn assert_refused(o: &std::process::Output, words: &[&str]) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(stdout(o).is_empty(), "{}", stdout(o));
    for w in words {
        assert!(err.contains(w), "{w:?} in {err}");
    }
}

/// Native kernels from another CPU model: never judged bit for bit; one line says how to
/// remake the golden portably.
#[test]
fn a_golden_made_with_native_kernels_on_another_cpu_is_refused_with_how_to_remake_it() {
    let dir = edited_article(|m| {
        m["kernels"]["mode"] = "native".into();
        m["kernels"]["cpu_capability"] = "AVX512".into();
        m["kernels"]["onednn"] = true.into();
        m["kernels"]["mkl_cbwr"] = serde_json::Value::Null;
        m["machine"]["cpu"] = "Some Other CPU".into();
    });
    // It adopts the golden's native mode, then refuses: the CPU is another.
    let golden = dir.path().display().to_string();
    let mut args = golden_flags("article");
    args.extend(["--golden".to_string(), golden]);
    let o = native(&args.iter().map(String::as_str).collect::<Vec<_>>()).output().unwrap();
    assert_refused(&o, &["native kernels on another CPU", "Some Other CPU", "--kernels portable --bless"]);
}

#[test]
fn a_golden_that_does_not_say_how_it_was_made_is_refused() {
    let dir = edited_article(|m| {
        let m = m.as_object_mut().unwrap();
        m.remove("kernels");
        m.remove("machine");
    });
    assert_refused(&run_with_golden(dir.path(), &[]), &["does not say which kernels", "fixtures/make_golden.sh"]);
}

/// A run adopts its golden's kernels; asking for others is refused before anything runs.
#[test]
fn kernels_other_than_the_goldens_are_refused() {
    let o = run_with_golden(&repo("golden/article"), &["--kernels", "native"]);
    assert_refused(&o, &["--kernels", "made with portable kernels", "asks for native"]);
}

/// Kernels that give other bits for the same micro-batch (the test hook moves one gradient of
/// the second computation, as oneDNN's AMX bfloat16 convolution does on its own): exit 4 and
/// NO VERDICT in every report format, never NOT EQUIVALENT.
#[test]
fn kernels_that_do_not_repeat_give_no_verdict_in_every_report_format() {
    let dir = tempfile::tempdir().unwrap();
    let file = |f: &str| dir.path().join(f).display().to_string();
    let (json, md, junit) = (file("r.json"), file("r.md"), file("r.xml"));
    let args = flags(
        "--model resnet-tiny --data-size 4 --batch-size 2 --acc-steps 2 --gpus 1 --epochs 1 --image-size 8 \
         --max-steps 1 --dtype bfloat16 --lr 0.001 --momentum 0 --report table --report json --report markdown --report junit",
    );
    let mut args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    for f in ["-", &json, &md, &junit] {
        args.extend(["--report-file".to_string(), f.to_string()]);
    }
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_ddp-verify"))
        .args(&args)
        .env("DDP_VERIFY_TEST_UNREPEATABLE", "1")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(4), "{}\n{}", stdout(&o), stderr(&o));
    let table = stdout(&o);
    assert!(table.contains("NO VERDICT: this machine's kernels are not deterministic for bfloat16"), "{table}");
    assert!(table.contains("ATen AVX2") && !table.contains("NOT EQUIVALENT"), "{table}");
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["verdict"], "no-verdict");
    // The hook's NaN is an infinite jump, which JSON writes as null.
    let why = &report["no_verdict"]["kernels"];
    assert!(why["tensor"].as_str().is_some() && why["jump"].is_null(), "{report}");
    assert!(std::fs::read_to_string(&md).unwrap().contains("NO VERDICT"));
    let xml = std::fs::read_to_string(&junit).unwrap();
    let doc = roxmltree::Document::parse(&xml).unwrap();
    assert_eq!(doc.descendants().filter(|n| n.has_tag_name("error")).count(), 1, "{xml}");
    assert_eq!(doc.root_element().attribute("failures"), Some("0"), "{xml}");
}

/// The same run with kernels that repeat: a verdict, and it is the right one.
#[test]
fn a_one_rank_bfloat16_resnet_on_repeating_kernels_gets_a_verdict() {
    let o = ddp_verify(&flags(
        "--model resnet-tiny --data-size 4 --batch-size 2 --acc-steps 2 --gpus 1 --epochs 1 --image-size 8 \
         --max-steps 1 --dtype bfloat16 --lr 0.001 --momentum 0",
    ));
    assert_eq!(o.status.code(), Some(0), "{}\n{}", stdout(&o), stderr(&o));
}

/// ddp-verify with this machine's own kernels: without the portable mode's variables,
/// which this test process set for itself (tests/tests.rs) and its children inherit.
fn native(args: &[&str]) -> std::process::Command {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_ddp-verify"));
    cmd.args(args).env_remove("ATEN_CPU_CAPABILITY").env_remove("MKL_CBWR");
    cmd
}

/// `devices` says which kernels compute and checks every model and dtype repeats, in seconds.
#[test]
fn devices_checks_that_every_model_and_dtype_repeats() {
    let o = ddp_verify(&["devices"]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{}", stderr(&o));
    assert!(
        out.contains("--kernels portable: ") && out.contains("ATen AVX2, oneDNN off, MKL_CBWR=COMPATIBLE"),
        "{out}"
    );
    let onednn = out.lines().find(|l| l.starts_with("oneDNN:   ")).unwrap_or_default();
    assert!(onednn.contains(" here, used by --kernels native"), "{out}");
    let checks: Vec<&str> = out.lines().filter(|l| l.starts_with("  cpu ")).collect();
    assert_eq!(checks.len(), 18, "{out}");
    assert!(checks.iter().all(|l| l.contains(" repeats (")), "{out}");
    let o = native(&["devices", "--kernels", "native"]).env("DDP_VERIFY_TEST_UNREPEATABLE", "1").output().unwrap();
    assert_eq!(o.status.code(), Some(4), "{}", stdout(&o));
    assert!(stdout(&o).contains("18 of 18 checks differ"), "{}", stdout(&o));
}

/// What makes the portable mode portable, seen from inside libtorch on whatever machine runs
/// this: over every model, dtype and autocast dtype (`devices`), oneDNN runs no primitive and
/// every MKL call takes the COMPATIBLE branch on one thread (their own verbose logs say so).
#[test]
fn portable_kernels_run_no_onednn_and_only_mkls_compatible_branch() {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_ddp-verify"))
        .args(["devices"])
        .env("ONEDNN_VERBOSE", "1")
        .env("MKL_VERBOSE", "1")
        .output()
        .unwrap();
    let out = stdout(&o) + &stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    let onednn: Vec<&str> = out.lines().filter(|l| l.starts_with("onednn_verbose") && l.contains(",exec,")).collect();
    assert!(onednn.is_empty(), "oneDNN ran: {:?}", &onednn[..onednn.len().min(3)]);
    let mkl: Vec<&str> = out.lines().filter(|l| l.starts_with("MKL_VERBOSE") && l.contains("us ")).collect();
    assert!(!mkl.is_empty(), "no MKL call logged:\n{out}");
    let other: Vec<&&str> = mkl.iter().filter(|l| !(l.contains("CNR:COMPATIBLE") && l.contains("NThr:1"))).collect();
    assert!(other.is_empty(), "MKL calls off the COMPATIBLE branch: {:?}", &other[..other.len().min(3)]);
}

/// One suite computes in one process set: cases asking for other kernels are refused by name.
#[test]
fn a_suite_computes_every_case_with_one_kind_of_kernels() {
    let t = tempfile::tempdir().unwrap();
    let file = t.path().join("suite.toml");
    std::fs::write(&file, "[[case]]\nname = \"a\"\n\n[[case]]\nname = \"b\"\nkernels = \"native\"\n").unwrap();
    let o = ddp_verify(&["suite", &file.display().to_string()]);
    assert_refused(&o, &["case 'b' computes with native kernels, the suite with portable"]);
    // The suite's --kernels is every case's that names none.
    let o = ddp_verify(&["suite", &file.display().to_string(), "--kernels", "native"]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
}

/// --bless records the run's own kernels and machine: a native golden checks on this CPU and
/// is refused once its header says another CPU made it.
#[test]
fn a_native_golden_blessed_here_checks_here_only() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("g");
    let g = dir.display().to_string();
    let run = |extra: &[&str]| {
        let mut args = vec!["--data-size", "8", "--gpus", "2", "--golden", &g];
        args.extend(extra);
        let mut cmd = native(&args);
        cmd.env_remove("CI").output().unwrap()
    };
    let o = run(&["--kernels", "native", "--bless"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let meta = json_file(&dir.join("config.json").display().to_string());
    assert_eq!(meta["kernels"]["mode"], "native", "{meta}");
    assert_eq!(meta["machine"]["cpu"], crate::util::platform().machine.cpu.as_str(), "{meta}");
    let o = run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("native kernels"), "{}", stdout(&o));
    let mut meta = meta;
    meta["machine"]["cpu"] = "Another CPU".into();
    std::fs::write(dir.join("config.json"), serde_json::to_string(&meta).unwrap()).unwrap();
    assert_refused(&run(&[]), &["native kernels on another CPU", "Another CPU"]);
}
