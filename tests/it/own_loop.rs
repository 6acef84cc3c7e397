//! examples/own-loop: the seed article's scripts with the `ddp_verify_trace` recorder,
//! recorded by real PyTorch (torchrun, gloo) and judged by `compare`.

use std::process::Command;

use crate::util::{ddp_verify, repo, stderr, stdout};

#[test]
fn the_articles_scripts_compare_equivalent_and_the_mistake_is_named() {
    let t = tempfile::tempdir().unwrap();
    let record = || Command::new("bash").arg(repo("examples/own-loop/run.sh")).arg(t.path()).output().unwrap();
    let mut out = record();
    if !out.status.success() {
        // Once in four full parallel test runs here a torchrun rank failed while other tests
        // started mpirun and their ranks (cause not captured): the launcher's luck, not the
        // recorder's or compare's. Say so in the log and record once more.
        eprintln!("run.sh failed once, recording again:\n{}{}", stdout(&out), stderr(&out));
        out = record();
    }
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let judge = |dir: &str| {
        let d = t.path().join(dir).display().to_string();
        let out = ddp_verify(&["compare", &d, "--report", "json"]);
        let json: serde_json::Value =
            serde_json::from_str(&stdout(&out)).unwrap_or_else(|e| panic!("{e}: {}", stderr(&out)));
        (out.status.code(), json)
    };
    let (code, good) = judge("good");
    assert_eq!(code, Some(0), "{good}");
    assert_eq!(good["traces"]["magnitudes"], true);
    assert_eq!(good["traces"]["right"]["meta"]["world_size"], "2");
    // The article's printed weights, to its 4 decimals.
    let w: Vec<f64> = serde_json::from_value(good["final_weights"]["ddp"]["linear.weight"].clone()).unwrap();
    let printed: Vec<String> = w.iter().map(|x| format!("{x:.4}")).collect();
    assert_eq!(printed, ["0.9472", "0.9440", "0.9527", "0.9687", "0.9570", "0.9343", "0.9411", "0.9186"]);
    let (code, mistake) = judge("mistake");
    assert_eq!(code, Some(1), "{mistake}");
    assert_eq!(mistake["diagnosis"]["reason"], "loss scaling", "{mistake}");
}
