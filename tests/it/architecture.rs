//! The one-way flow, held by a test: each module of the library uses only modules below
//! it in the order lib.rs documents, and the flags, defaults and value names are defined
//! once, in `crates/cli`.

use std::path::Path;

use crate::util::repo;

/// Top to bottom. A module may use itself and anything after it, never anything before.
const LAYERS: [&[&str]; 10] = [
    &["lower"],
    &["jobs"],
    &["report"],
    &["judge"],
    &["train"],
    &["dist"],
    &["evidence"],
    &["plan"],
    &["spec"],
    &["error", "outputs", "profile"],
];

fn layer(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every `crate::<module>` a file names, in code, doc links and all.
fn uses(text: &str) -> Vec<String> {
    text.match_indices("crate::")
        .filter(|(i, _)| !text[..*i].ends_with('_')) // ddp_verify_crate:: and the like
        .map(|(i, m)| {
            text[i + m.len()..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect::<String>()
        })
        .collect()
}

#[test]
fn every_module_uses_only_the_stages_below_it() {
    let src = repo("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut wrong = Vec::new();
    for file in files {
        let rel = file.strip_prefix(&src).unwrap();
        let top = rel.iter().next().unwrap().to_str().unwrap().trim_end_matches(".rs");
        // The two binaries sit above everything; lib.rs only declares.
        let Some(mine) = layer(top) else { continue };
        for used in uses(&std::fs::read_to_string(&file).unwrap()) {
            match layer(&used) {
                Some(theirs) if theirs >= mine => {}
                Some(_) => wrong.push(format!("{} uses crate::{used}", rel.display())),
                None => wrong.push(format!("{} uses crate::{used}, which is in no layer", rel.display())),
            }
        }
    }
    assert!(wrong.is_empty(), "imports against the flow:\n{}", wrong.join("\n"));
}

#[test]
fn every_library_module_is_in_a_layer() {
    let lib = std::fs::read_to_string(repo("src/lib.rs")).unwrap();
    let modules: Vec<&str> =
        lib.lines().filter_map(|l| l.strip_prefix("pub mod ")).map(|m| m.trim_end_matches(';')).collect();
    assert!(modules.len() >= 10, "{modules:?}");
    for m in modules {
        assert!(layer(m).is_some(), "src/lib.rs declares {m}, which tests/it/architecture.rs puts in no layer");
    }
}

/// Defaults and flag names are written once, in crates/cli: the library reads them from
/// there, so no other source file spells a default flag value in a clap attribute.
#[test]
fn flags_are_defined_only_in_the_cli_crate() {
    let src = repo("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(!text.contains("#[arg("), "{} defines a flag; flags live in crates/cli", file.display());
        assert!(!text.contains("default_value"), "{} defines a default; defaults live in crates/cli", file.display());
    }
}

/// The PyTorch reference scripts cannot read crates/cli, so their shared flags are held to
/// its defaults here: a golden made with the scripts' defaults is the tool's default run.
#[test]
fn the_reference_scripts_share_the_tools_defaults() {
    use ddp_verify_cli::defaults as d;
    let code = "import json, sys; sys.path.insert(0, 'fixtures'); import linear_reference as r; \
                a = r.split_parser(8, 2).parse_args(['accumulation', '--out', 'x']); print(json.dumps(vars(a)))";
    let out = std::process::Command::new(repo(".venv/bin/python"))
        .args(["-c", code])
        .current_dir(repo("."))
        .output()
        .expect("the .venv from scripts/setup.sh");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let py: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ours = serde_json::json!({
        "data_size": d::DATA_SIZE, "seed": d::SEED, "epochs": d::EPOCHS, "batch_size": d::BATCH_SIZE,
        "acc_steps": d::ACC_STEPS, "gpus": d::GPUS, "lr": d::LR, "momentum": d::MOMENTUM,
    });
    for (key, want) in ours.as_object().unwrap() {
        assert_eq!(&py[key], want, "fixtures/linear_reference.py --{} default", key.replace('_', "-"));
    }
}
