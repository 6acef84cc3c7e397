//! `ddp-verify compare A B`: recorded traces judged like a run, from ddp-verify's own
//! `--save-trace`, from real PyTorch's goldens, and refused when they do not line up.

use std::path::Path;
use std::process::Command;

use crate::util::{ddp_verify, flags, repo, stderr, stdout};

fn dir(t: &tempfile::TempDir, name: &str) -> String {
    t.path().join(name).display().to_string()
}

/// The JSON report of `compare` on `args`, with its exit code.
fn compared(args: &[&str]) -> (Option<i32>, serde_json::Value) {
    let mut all = vec!["compare"];
    all.extend(args);
    all.extend(["--report", "json"]);
    let out = ddp_verify(&all);
    let json = serde_json::from_str(&stdout(&out)).unwrap_or_else(|e| panic!("{e}: {}", stderr(&out)));
    (out.status.code(), json)
}

/// Property: over runs of every kind (honest and with planted bugs), `compare` on the traces
/// a run saved reaches the run's own verdict, and names the same likely cause.
#[test]
fn compare_reaches_the_verdict_of_the_run_that_saved_the_traces() {
    let t = tempfile::tempdir().unwrap();
    let cases = [
        "--acc-steps 2 --gpus 2",
        "--acc-steps 6 --gpus 3 --data-size 24 --batch-size 2 --shuffle --epochs 3",
        "--acc-steps 4 --gpus 2 --data-size 11 --batch-size 2 --drop-last --epochs 3 --dtype float64",
        "--acc-steps 2 --gpus 2 --inject no-loss-scale",
        "--acc-steps 4 --gpus 2 --data-size 16 --batch-size 2 --shuffle --epochs 2 --inject no-set-epoch",
        "--acc-steps 4 --gpus 2 --data-size 16 --batch-size 2 --inject stale-zero-grad",
    ];
    for (i, case) in cases.iter().enumerate() {
        let d = dir(&t, &i.to_string());
        let mut run = flags(case);
        run.extend(["--save-trace", &d, "--report", "json"]);
        let out = ddp_verify(&run);
        let ran: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
        let (code, judged) = compared(&[&d]);
        assert_eq!(code, out.status.code(), "{case}: {judged}");
        assert_eq!(judged["verdict"], ran["verdict"], "{case}");
        assert_eq!(judged["diagnosis"]["reason"], ran["diagnosis"]["reason"], "{case}: {judged}");
        assert_eq!(judged["traces"]["left"]["meta"]["run"], "accumulation");
        assert_eq!(judged["traces"]["right"]["meta"]["run"], "ddp");
    }
}

/// Property: the same runs' traces, sampled (two elements of every tensor larger than that,
/// and each whole tensor's summaries), reach the same verdicts and causes, both sides sampled
/// or one (compare samples the whole one at the other's positions).
#[test]
fn sampled_traces_reach_the_verdicts_and_causes_of_whole_ones() {
    use ddp_verify::evidence::{Sampled, Sampling, Trace};
    let t = tempfile::tempdir().unwrap();
    let cases = [
        "--acc-steps 2 --gpus 2 --features 8",
        "--acc-steps 4 --gpus 2 --data-size 16 --batch-size 2 --features 8 --optimizer adamw",
        "--acc-steps 2 --gpus 2 --features 8 --inject no-loss-scale",
        "--acc-steps 4 --gpus 2 --data-size 16 --batch-size 2 --features 8 --inject stale-zero-grad",
        "--acc-steps 4 --gpus 2 --data-size 16 --batch-size 2 --features 8 --inject clip-per-micro-batch --clip-grad-norm 0.1",
    ];
    for (i, case) in cases.iter().enumerate() {
        let d = dir(&t, &i.to_string());
        let mut run = flags(case);
        run.extend(["--save-trace", &d]);
        ddp_verify(&run);
        let (code, whole) = compared(&[&d]);
        let load = |f: &str| Trace::load(Path::new(&format!("{d}/{f}.safetensors"))).unwrap();
        let acc = load("accumulation");
        let params = acc.finals.iter().filter(|(_, w)| w.numel() > 2).map(|(n, w)| {
            let last = w.numel() - 1;
            (n.clone(), Sampled { positions: std::sync::Arc::new(vec![last / 3, last]), shape: w.shape().to_vec() })
        });
        let like = Sampling { size: 2, params: params.collect(), ..Sampling::default() };
        assert!(!like.params.is_empty(), "{case}");
        let sampled = dir(&t, &format!("{i}-sampled"));
        std::fs::create_dir(&sampled).unwrap();
        for f in ["accumulation", "ddp"] {
            let s = load(f).sampled_like(&like).unwrap();
            s.save(Path::new(&format!("{sampled}/{f}.safetensors"))).unwrap();
        }
        let (sampled_code, both) = compared(&[&sampled]);
        let whole_ddp = format!("{d}/ddp.safetensors");
        let (mixed_code, mixed) = compared(&[&format!("{sampled}/accumulation.safetensors"), &whole_ddp]);
        for (c, judged) in [(sampled_code, &both), (mixed_code, &mixed)] {
            assert_eq!(c, code, "{case}: {judged}");
            assert_eq!(judged["diagnosis"]["reason"], whole["diagnosis"]["reason"], "{case}: {judged}");
            assert_eq!(judged["traces"]["sampling"]["size"], 2, "{case}");
        }
        assert_eq!(mixed["traces"]["sampling"]["recorded"], serde_json::json!([true, false]), "{case}");
    }
}

/// Real PyTorch's traces (torchrun, gloo) of equivalent runs, in every dtype and model.
#[test]
fn pytorch_goldens_compare_equivalent() {
    for g in ["article", "w3", "uneven", "carry-drop-last", "k4-w2-float16", "article-bfloat16", "resnet-tiny-k2-w2"] {
        let (code, judged) = compared(&[&repo(&format!("golden/{g}")).display().to_string()]);
        assert_eq!(code, Some(0), "{g}: {judged}");
        // PyTorch's goldens carry no header: the report says what bounds were used.
        assert_eq!(judged["traces"]["magnitudes"], false, "{g}");
        assert!(judged["runs"]["worst_fraction"].as_f64().unwrap() <= 1.0);
    }
}

#[test]
fn compare_writes_every_report_and_the_plot() {
    let t = tempfile::tempdir().unwrap();
    let d = dir(&t, "run");
    ddp_verify(&["--save-trace", &d, "--inject", "no-loss-scale"]);
    let (xml, svg, md) = (dir(&t, "c.xml"), dir(&t, "c.svg"), dir(&t, "c.md"));
    let args = ["compare", &d, "--report", "junit", "--report-file", &xml, "--report", "md", "--report-file", &md];
    let mut args = args.to_vec();
    args.extend(["--report", "table", "--plot", &svg]);
    let out = ddp_verify(&args);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("ddp-verify compare: two recorded traces"), "{text}");
    assert!(text.contains("held to: the fixed tolerance"), "{text}");
    assert!(text.contains("likely cause: ddp gradients are exactly 0.50x accumulation's"), "{text}");
    let xml = std::fs::read_to_string(&xml).unwrap();
    let doc = roxmltree::Document::parse(&xml).unwrap();
    assert!(doc.descendants().any(|n| n.has_tag_name("failure")));
    assert!(std::fs::read_to_string(&md).unwrap().contains("❌ NOT EQUIVALENT"));
    assert!(std::fs::read_to_string(&svg).unwrap().starts_with("<svg"));
    // Nothing is overwritten without --force.
    let again = ddp_verify(&["compare", &d, "--plot", &svg]);
    assert_eq!(again.status.code(), Some(2), "{}", stderr(&again));
}

/// Traces that do not line up are bad input (exit 2), one line naming the first mismatch.
#[test]
fn traces_that_do_not_line_up_are_refused_naming_the_first_mismatch() {
    let t = tempfile::tempdir().unwrap();
    let (two, three, wide) = (dir(&t, "two"), dir(&t, "three"), dir(&t, "wide"));
    ddp_verify(&["--save-trace", &two]);
    ddp_verify(&["--save-trace", &three, "--epochs", "3"]);
    ddp_verify(&["--save-trace", &wide, "--features", "6"]);
    let acc = |d: &str| format!("{d}/accumulation.safetensors");
    let ddp = |d: &str| format!("{d}/ddp.safetensors");
    let refused = |a: &str, b: &str, says: &str| {
        let out = ddp_verify(&["compare", a, b]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(says), "{says}: {err}");
    };
    // A different number of optimizer steps is a verdict with its cause, not bad input.
    let steps = ddp_verify(&["compare", &acc(&two), &ddp(&three)]);
    assert_eq!(steps.status.code(), Some(1), "{}", stderr(&steps));
    assert!(stdout(&steps).contains("made 2 optimizer steps and ddp made 3"), "{}", stdout(&steps));
    refused(&acc(&two), &ddp(&wide), "linear.weight has shape [1, 8] there, [1, 6] here");
    refused(&acc(&two), &acc(&two), "is the same file as A");
    refused(&acc(&two), &dir(&t, "none.safetensors"), "trace does not exist");
    let junk = dir(&t, "junk.safetensors");
    std::fs::write(&junk, b"not a trace").unwrap();
    refused(&acc(&two), &junk, "not a readable safetensors file");
    let out = ddp_verify(&["compare", &acc(&two)]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("give the DDP trace as a second argument"), "{}", stderr(&out));
    assert!(Path::new(&acc(&two)).exists());
}

/// Recorded magnitudes widen what a difference may be: a NaN or Inf among them would let any
/// difference pass, so such a trace is refused (exit 2), even for runs that differ.
#[test]
fn non_finite_magnitudes_are_refused_not_trusted() {
    let t = tempfile::tempdir().unwrap();
    let d = dir(&t, "bug");
    ddp_verify(&["--save-trace", &d, "--inject", "no-loss-scale"]);
    for (name, bad) in [("scale.0.linear.weight", "nan"), ("peak.linear.weight", "inf")] {
        let edited = dir(&t, &format!("{name}.safetensors"));
        let script = format!(
            "from safetensors.torch import load_file, save_file\n\
             t = load_file('{d}/ddp.safetensors')\n\
             for s in range(2): t[f'scale.{{s}}.linear.weight'] = t[f'grads.{{s}}.linear.weight'].abs()\n\
             t['{name}'] = t['{name}'].fill_(float('{bad}'))\n\
             save_file(t, '{edited}')\n"
        );
        let py = Command::new(repo(".venv/bin/python")).args(["-c", &script]).output().unwrap();
        assert!(py.status.success(), "{}", stderr(&py));
        let out = ddp_verify(&["compare", &format!("{d}/accumulation.safetensors"), &edited]);
        assert_eq!(out.status.code(), Some(2), "{name}: {}", stdout(&out));
        assert!(stderr(&out).contains(&format!("{name} holds NaN or Inf")), "{}", stderr(&out));
    }
}

/// A header that lacks a key `compare` relies on, or holds one that does not parse, is bad
/// input (exit 2): one line naming the file and the key, never judged as if fine. A format
/// newer than this build's is named by its version.
#[test]
fn a_header_missing_a_key_or_holding_garbage_is_refused_naming_the_key() {
    let t = tempfile::tempdir().unwrap();
    let d = dir(&t, "run");
    ddp_verify(&["--save-trace", &d]);
    let acc = format!("{d}/accumulation.safetensors");
    for (key, value, says) in [
        ("world_size", Some("garbage"), "header key world_size: 'garbage' is not a whole number"),
        ("dtype", None, "header key dtype: missing"),
        ("run", Some("sideways"), "header key run: 'sideways' is none of"),
        ("format", Some("ddp-verify-trace/9"), "newer than this ddp-verify reads (ddp-verify-trace/1 to /2)"),
    ] {
        let edited = dir(&t, &format!("{key}.safetensors"));
        let edit = match value {
            Some(v) => format!("m['{key}'] = '{v}'"),
            None => format!("del m['{key}']"),
        };
        let script = format!(
            "from safetensors import safe_open\nfrom safetensors.torch import load_file, save_file\n\
             m = dict(safe_open('{d}/ddp.safetensors', 'pt').metadata())\n{edit}\n\
             save_file(load_file('{d}/ddp.safetensors'), '{edited}', metadata=m)\n"
        );
        let py = Command::new(repo(".venv/bin/python")).args(["-c", &script]).output().unwrap();
        assert!(py.status.success(), "{}", stderr(&py));
        let out = ddp_verify(&["compare", &acc, &edited]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{key}: {}", stdout(&out));
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(&edited) && err.contains(says), "{key}: {err}");
    }
}
