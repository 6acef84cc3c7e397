//! `ddp-verify suite FILE.toml`: named cases for a CI gate, on ranks started once.

use crate::util::{ddp_verify, flags, repo, stderr, stdout};

fn suite_file(t: &tempfile::TempDir, toml: &str) -> String {
    let path = t.path().join("suite.toml");
    std::fs::write(&path, toml).unwrap();
    path.display().to_string()
}

/// The committed example: every case equivalent, one JUnit test case per suite case, and
/// the ranks started once for the largest W.
#[test]
fn the_example_suite_passes_with_one_junit_case_per_case() {
    let t = tempfile::tempdir().unwrap();
    let (xml, json) = (t.path().join("s.xml"), t.path().join("s.json"));
    let (xml_s, json_s) = (xml.display().to_string(), json.display().to_string());
    let file = repo("examples/suite.toml").display().to_string();
    let out = ddp_verify(&[
        "suite",
        &file,
        "--report",
        "junit",
        "--report-file",
        &xml_s,
        "--report",
        "json",
        "--report-file",
        &json_s,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let toml: toml::Table = std::fs::read_to_string(&file).unwrap().parse().unwrap();
    let cases = toml["case"].as_array().unwrap();
    let xml = std::fs::read_to_string(&xml).unwrap();
    let doc = roxmltree::Document::parse(&xml).unwrap();
    let names: Vec<&str> =
        doc.descendants().filter(|n| n.has_tag_name("testcase")).filter_map(|n| n.attribute("name")).collect();
    let expected: Vec<&str> = cases.iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, expected);
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let most = cases.iter().map(|c| c.get("gpus").and_then(|g| g.as_integer()).unwrap_or(2)).max().unwrap();
    assert_eq!(report["ranks"].as_i64(), Some(most));
}

/// A suite's verdict per case is the verdict of the same case run alone; one NOT
/// EQUIVALENT case makes the suite exit 1 and the report names its likely cause.
#[test]
fn each_case_gets_the_verdict_it_gets_alone() {
    let t = tempfile::tempdir().unwrap();
    let lines = [
        ("honest", "--acc-steps 2 --gpus 2"),
        ("no loss scale", "--acc-steps 2 --gpus 2 --inject no-loss-scale"),
        ("w3 contiguous", "--acc-steps 3 --gpus 3 --data-size 12 --batch-size 2 --inject contiguous-split"),
        ("tiny w1", "--model resnet-tiny --acc-steps 2 --gpus 1 --data-size 8 --image-size 8 --max-steps 1"),
    ];
    let mut toml = String::new();
    for (name, line) in lines {
        toml += &format!("[[case]]\nname = \"{name}\"\n");
        for pair in line.trim_start_matches("--").split(" --") {
            let (k, v) = pair.split_once(' ').unwrap();
            let v = if v.parse::<f64>().is_ok() { v.to_string() } else { format!("\"{v}\"") };
            toml += &format!("{k} = {v}\n");
        }
    }
    let file = suite_file(&t, &toml);
    let out = ddp_verify(&["suite", &file, "--report", "json"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    for (i, (name, line)) in lines.iter().enumerate() {
        let alone = ddp_verify(&flags(&format!("{line} --report json")));
        let alone_json: serde_json::Value = serde_json::from_str(&stdout(&alone)).unwrap();
        let case = &report["cases"][i];
        assert_eq!(case["name"], *name);
        assert_eq!(case["verdict"], alone_json["verdict"], "{name}");
        assert_eq!(case["diagnosis"]["reason"], alone_json["diagnosis"]["reason"], "{name}");
    }
}

/// An invalid case stops the suite before any rank starts: exit 2, one line naming the
/// case and the key.
#[test]
fn an_invalid_case_is_refused_naming_the_case_and_key() {
    let t = tempfile::tempdir().unwrap();
    for (toml, says) in [
        ("[[case]]\nname = \"a\"\nacc-step = 2\n", "case 'a', key acc-step: not a flag"),
        ("[[case]]\nname = \"a\"\ngpus = \"two\"\n", "case 'a', key gpus:"),
        ("[[case]]\nname = \"a\"\nshuffle = \"yes\"\n", "case 'a', key shuffle: is a switch"),
        ("[[case]]\nname = \"a\"\nacc-steps = 3\ngpus = 2\n", "case 'a', key acc-steps:"),
        ("[[case]]\nname = \"a\"\nmodel = \"resnet50\"\n", "case 'a', key model:"),
        ("[[case]]\nname = \"a\"\nreport = \"json\"\n", "case 'a', key report: not allowed in a suite"),
        ("[[case]]\nname = \"a\"\nbless = true\n", "case 'a', key bless: not allowed in a suite"),
        ("[[case]]\nname = \"a\"\n[[case]]\nname = \"a\"\n", "two cases are named 'a'"),
        ("[[case]]\ngpus = 2\n", "case 1 has no name"),
        ("[[case]]\nname = \"a\"\ngpus = [2]\n", "case 'a', key gpus: a array is not a flag's value"),
        ("title = \"x\"\n", "unknown top-level key 'title'"),
        ("[[case]\n", "not valid TOML"),
        ("", "no [[case]] tables"),
    ] {
        let file = suite_file(&t, toml);
        let out = ddp_verify(&["suite", &file]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{toml}: {err}");
        assert_eq!(err.lines().count(), 1, "{toml}: {err}");
        assert!(err.contains(says), "{toml}: {says}: {err}");
    }
    let out = ddp_verify(&["suite", "no-such-suite.toml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("suite file does not exist"), "{}", stderr(&out));
}

/// One deadline for the whole suite: past it every rank is stopped, exit 3, nothing left.
#[test]
fn a_suite_past_its_timeout_is_stopped() {
    let t = tempfile::tempdir().unwrap();
    let file = suite_file(&t, "[[case]]\nname = \"slow\"\nmodel = \"resnet-tiny\"\ndata-size = 512\nepochs = 3\n");
    let out = ddp_verify(&["suite", &file, "--timeout", "1"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("did not finish within --timeout 1 s"), "{}", stderr(&out));
}
