//! Every report format, snapshot-tested on committed PyTorch traces (no processes, so the
//! numbers are fixed), and the JUnit file read back by an XML parser.

use std::path::PathBuf;

use ddp_verify::evidence::golden::{Golden, GoldenMeta};
use ddp_verify::evidence::Trace;
use ddp_verify::jobs::verify::assemble;
use ddp_verify::judge::Outcome;
use ddp_verify::spec::{Format, RunShape};
use ddp_verify::train::models;
use ddp_verify::{Config, Tolerance, TrainConfig};

/// PyTorch's accumulation and DDP traces of a golden case, compared with each other and the
/// golden itself (paths relative to the package root, where cargo runs tests).
fn outcome(case: &str, tolerance: Tolerance) -> Outcome {
    let dir = PathBuf::from(format!("golden/{case}"));
    let meta: GoldenMeta = serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let golden =
        Golden::load(&dir, &meta.train, &models::shapes(&meta.train).unwrap(), crate::util::platform()).unwrap();
    let acc = Trace::load(&dir.join("accumulation.safetensors")).unwrap();
    let ddp = Trace::load(&dir.join("ddp.safetensors")).unwrap();
    // PyTorch's big batch where the golden has one (tiny-lm's).
    let big = Trace::load(&dir.join("big_batch.safetensors")).ok();
    let cfg = Config {
        train: TrainConfig { run: RunShape { big_batch: big.is_some(), ..meta.train.run }, ..meta.train },
        tolerance,
        derive_bounds: false,
        save_trace: None,
        golden: Some(dir),
        force: false,
        bless: false,
        reports: Vec::new(),
        timeout_s: 600.0,
        plot: None,
        strict_buffers: false,
        device_note: "cpu (--device cpu)".into(),
        kernels: ddp_verify::spec::KernelMode::Portable,
    };
    assemble(&cfg, acc, ddp, big, Some(golden))
}

/// W=3 traces (gloo and the single process sum in different orders) under a zero tolerance:
/// a real, reproducible NOT EQUIVALENT.
fn diverged() -> Outcome {
    outcome("w3", Tolerance { max_ulps: 0, rtol: 0.0, atol: 0.0 })
}

fn render(f: Format, o: &Outcome) -> String {
    ddp_verify::report::render(f, o)
}

#[test]
fn table_report() {
    insta::assert_snapshot!("table_equivalent", render(Format::Table, &outcome("article", Tolerance::default())));
    insta::assert_snapshot!("table_diverged", render(Format::Table, &diverged()));
    // A ResNet: worst tensors named, the mode, and BatchNorm buffers in their own section.
    insta::assert_snapshot!(
        "table_resnet",
        render(Format::Table, &outcome("resnet-tiny-k4-w2-shuffle", Tolerance::default()))
    );
}

#[test]
fn json_report() {
    // The versions of this build and its libtorch change without the report changing:
    // redacted line by line, so every number keeps the exact text the report wrote.
    let text = render(Format::Json, &outcome("article", Tolerance::default()));
    let redacted: Vec<String> = text
        .lines()
        .map(|l| match l.split_once(": ") {
            Some((key, _)) if ["\"tool_version\"", "\"libtorch_version\""].contains(&key.trim()) => {
                format!("{key}: \"[redacted]\",")
            }
            _ => l.to_string(),
        })
        .collect();
    assert_eq!(redacted.iter().filter(|l| l.contains("[redacted]")).count(), 2, "{text}");
    insta::assert_snapshot!("json_equivalent", redacted.join("\n") + "\n");
    let v: serde_json::Value = serde_json::from_str(&render(Format::Json, &diverged())).unwrap();
    assert_eq!(v["schema_version"], 1);
    assert_eq!(v["verdict"], "not-equivalent");
    assert_eq!(v["diagnosis"]["reason"], "explicit tolerance");
}

#[test]
fn markdown_report() {
    insta::assert_snapshot!("markdown_equivalent", render(Format::Markdown, &outcome("article", Tolerance::default())));
    insta::assert_snapshot!("markdown_diverged", render(Format::Markdown, &diverged()));
}

#[test]
fn junit_report() {
    insta::assert_snapshot!("junit_diverged", render(Format::Junit, &diverged()));
}

#[test]
fn junit_parses_as_xml_with_one_case_per_step_and_the_final_weights() {
    for (o, failing) in [(outcome("shuffle-3-epochs", Tolerance::default()), false), (diverged(), true)] {
        let xml = render(Format::Junit, &o);
        let doc = roxmltree::Document::parse(&xml).expect("well-formed XML");
        let suites: Vec<_> = doc.descendants().filter(|n| n.has_tag_name("testsuite")).collect();
        assert_eq!(suites.len(), 3, "runs + two golden comparisons");
        for s in &suites {
            let cases = s.children().filter(|n| n.has_tag_name("testcase")).count();
            assert_eq!(cases, o.runs.steps.len() + 1);
            assert_eq!(s.attribute("tests"), Some(cases.to_string().as_str()));
        }
        let failures = doc.descendants().filter(|n| n.has_tag_name("failure")).count();
        assert_eq!(failures > 0, failing, "{xml}");
        assert_eq!(doc.root_element().attribute("failures"), Some(failures.to_string().as_str()));
    }
}

#[test]
fn plot_is_svg_with_a_marker_per_step_and_the_allowance_line() {
    let o = diverged();
    let svg = ddp_verify::report::plot::svg(&o);
    insta::assert_snapshot!("plot_diverged", svg);
    let doc = roxmltree::Document::parse(&svg).expect("well-formed SVG");
    let markers = doc.descendants().filter(|n| n.has_tag_name("circle") && n.attribute("r") == Some("3.5")).count();
    assert_eq!(markers, 3 * (o.runs.steps.len() + 1), "a marker per step and final weights, for 3 comparisons");
    assert!(svg.contains("allowed (1e0)"), "the allowance line is labelled");
    // No text runs off the right edge (about 0.6 em a character, wide for a sans-serif).
    let width: f64 = doc.root_element().attribute("width").unwrap().parse().unwrap();
    for t in doc.descendants().filter(|n| n.has_tag_name("text") && n.attribute("text-anchor").is_none()) {
        let x: f64 = t.attribute("x").unwrap().parse().unwrap();
        let size: f64 = t.attribute("font-size").unwrap_or("12").parse().unwrap();
        let end = x + 0.6 * size * t.text().unwrap_or("").chars().count() as f64;
        assert!(end <= width, "{:?} ends at {end} of {width}", t.text());
    }
}
