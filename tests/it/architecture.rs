//! The one-way flow, held by a test: each module of the library uses only modules below
//! it in the order lib.rs documents, and the flags, defaults and value names are defined
//! once, in `crates/cli`.

use std::path::Path;

use crate::util::repo;

/// Top to bottom. A module may use itself and anything after it, never anything before.
const LAYERS: [&[&str]; 12] = [
    &["dispatch"],
    &["lower"],
    &["jobs"],
    &["report"],
    &["judge"],
    &["train"],
    &["dist"],
    &["bounds"],
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

/// The file-level graph of one folder of `src/`: its files and sub-folders (a folder counts
/// as one node), each with the siblings it names, through `super::x`, `self::x` or
/// `crate::<folder>::x`. The folder's `mod.rs` is left out: it declares its children,
/// which use its items. Test modules are left out too.
fn sibling_graph(dir: &Path, module: &str) -> Vec<(String, Vec<String>)> {
    let entries: Vec<std::path::PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    let name = |p: &Path| p.file_stem().unwrap().to_str().unwrap().to_string();
    let nodes: Vec<String> = entries
        .iter()
        .filter(|p| p.is_dir() || (p.extension().is_some_and(|e| e == "rs") && name(p) != "mod"))
        .map(|p| name(p))
        .collect();
    let code = |p: &Path| {
        let text = std::fs::read_to_string(p).unwrap();
        text.split("#[cfg(test)]").next().unwrap().to_string()
    };
    let mut graph = Vec::new();
    for node in &nodes {
        let path = dir.join(node);
        let (texts, up) = match path.is_dir() {
            true => {
                let mut files = Vec::new();
                rust_files(&path, &mut files);
                // From inside a sub-folder, the folder's siblings are super::super:: away
                // (super:: from its mod.rs).
                (files.iter().map(|f| (code(f), f.ends_with("mod.rs"))).collect::<Vec<_>>(), true)
            }
            false => (vec![(code(&path.with_extension("rs")), false)], false),
        };
        let mut uses = Vec::new();
        for (text, is_mod) in texts {
            let prefixes = match (up, is_mod) {
                (false, _) | (true, true) => vec!["super::".to_string(), format!("crate::{module}::")],
                (true, false) => vec!["super::super::".to_string(), format!("crate::{module}::")],
            };
            for prefix in prefixes {
                for (i, _) in text.match_indices(&prefix) {
                    if prefix == "super::" && text[..i].ends_with("super::") {
                        continue;
                    }
                    let rest: String = text[i + prefix.len()..]
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    if nodes.contains(&rest) && rest != *node && !uses.contains(&rest) {
                        uses.push(rest);
                    }
                }
            }
        }
        graph.push((node.clone(), uses));
    }
    graph
}

/// A cycle in `graph`, as the names along it, if there is one.
fn find_cycle(graph: &[(String, Vec<String>)]) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        graph: &[(String, Vec<String>)],
        path: &mut Vec<String>,
        done: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == n) {
            let mut cycle = path[i..].to_vec();
            cycle.push(n.to_string());
            return Some(cycle);
        }
        if done.iter().any(|d| d == n) {
            return None;
        }
        path.push(n.to_string());
        let next = graph.iter().find(|(m, _)| m == n).map(|(_, u)| u.clone()).unwrap_or_default();
        for m in next {
            if let Some(c) = visit(&m, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.push(n.to_string());
        None
    }
    let mut done = Vec::new();
    graph.iter().find_map(|(n, _)| visit(n, graph, &mut Vec::new(), &mut done))
}

/// Inside a stage, files depend on one another one way too: no file (or folder) reaches
/// back to itself through its siblings.
#[test]
fn no_files_of_a_folder_depend_on_each_other_in_a_cycle() {
    fn folders(dir: &Path, module: &str, out: &mut Vec<(std::path::PathBuf, String)>) {
        out.push((dir.to_path_buf(), module.to_string()));
        for entry in std::fs::read_dir(dir).unwrap() {
            let p = entry.unwrap().path();
            if p.is_dir() {
                let name = p.file_name().unwrap().to_str().unwrap().to_string();
                let sub = if module.is_empty() { name } else { format!("{module}::{name}") };
                folders(&p, &sub, out);
            }
        }
    }
    let mut all = Vec::new();
    folders(&repo("src"), "", &mut all);
    let mut cycles = Vec::new();
    for (dir, module) in all.iter().filter(|(_, m)| !m.is_empty()) {
        if let Some(c) = find_cycle(&sibling_graph(dir, module)) {
            cycles.push(format!("src/{}: {}", module.replace("::", "/"), c.join(" -> ")));
        }
    }
    assert!(cycles.is_empty(), "files in a cycle:\n{}", cycles.join("\n"));
}

#[test]
fn the_cycle_finder_finds_cycles() {
    let g = |edges: &[(&str, &[&str])]| -> Vec<(String, Vec<String>)> {
        edges.iter().map(|(n, u)| (n.to_string(), u.iter().map(|s| s.to_string()).collect())).collect()
    };
    assert_eq!(find_cycle(&g(&[("a", &["b"]), ("b", &["c"]), ("c", &[])])), None);
    assert_eq!(find_cycle(&g(&[("a", &["b"]), ("b", &["c"]), ("c", &["a"])])).map(|c| c.len()), Some(4));
}

/// Small files: no Rust or Python source of the project's is over 600 lines.
#[test]
fn no_source_file_is_over_600_lines() {
    fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy();
            if path.is_dir() && !name.starts_with('.') && name != "target" && name != "__pycache__" {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs" || e == "py") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    for dir in ["src", "crates", "tests", "python", "fixtures", "examples", "bench", "scripts"] {
        walk(&repo(dir), &mut files);
    }
    assert!(files.len() > 100, "{} files", files.len());
    let long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let lines = std::fs::read_to_string(f).unwrap().lines().count();
            (lines > 600).then(|| format!("{} ({lines} lines)", f.strip_prefix(repo("")).unwrap().display()))
        })
        .collect();
    assert!(long.is_empty(), "split these by concept:\n{}", long.join("\n"));
}

/// What the jobs may name of the judge: the one call that judges and its terms, `Judging`
/// (our own runs stream each step into it as it comes), and what a judgement hands on.
/// Everything else `judge` exports is how it judges (comparers, rules, bounds, costs): the
/// jobs load, call `judge::judge` and report, and hold no judgement of their own.
const WHAT_JOBS_READ_OF_THE_JUDGE: &[&str] = &[
    "judge",
    // `watch`: one run judged by its contracts, as `judge` judges two.
    "watch",
    "Watched",
    "Terms",
    "Judging",
    "Outcome",
    "Verdict",
    "Agreement",
    "Comparison",
    "GroupDiff",
    "TensorDiff",
    "NotJudged",
    "Problem",
    "BigBatch",
    "Diagnosis",
    "Reason",
];

/// The names a module file exports at its top level: its `pub use` lists (the name after
/// `as` where renamed) and its own `pub` items.
fn exports(text: &str) -> Vec<String> {
    let ident = |s: &str| s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect::<String>();
    let mut names = Vec::new();
    let starts = text.match_indices("pub ").map(|(i, _)| i).filter(|&i| i == 0 || text[..i].ends_with('\n'));
    for i in starts {
        let item = &text[i + "pub ".len()..];
        let Some(stmt) = item.strip_prefix("use ") else {
            let kinds = ["fn ", "struct ", "enum ", "const ", "static ", "type ", "trait "];
            names.extend(kinds.iter().filter_map(|k| item.strip_prefix(k)).map(ident));
            continue;
        };
        let stmt = &stmt[..stmt.find(';').unwrap()];
        let items = match stmt.find('{') {
            Some(open) => stmt[open + 1..stmt.rfind('}').unwrap()].split(',').collect::<Vec<_>>(),
            None => vec![stmt],
        };
        for item in items.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
            names.push(ident(item.rsplit(" as ").next().unwrap().rsplit("::").next().unwrap().trim()));
        }
    }
    names
}

/// Every name a file takes from the judge: `judge::name`, each name in `judge::{...}`, and
/// `*` for a glob.
fn names_from_the_judge(text: &str) -> Vec<String> {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut names = Vec::new();
    for (i, m) in text.match_indices("judge::") {
        if text[..i].ends_with(word) {
            continue;
        }
        let rest = &text[i + m.len()..];
        match rest.strip_prefix('{') {
            Some(group) => {
                let mut depth = 1;
                let end = group
                    .char_indices()
                    .find(|&(_, c)| {
                        depth += match c {
                            '{' => 1,
                            '}' => -1,
                            _ => 0,
                        };
                        depth == 0
                    })
                    .map_or(group.len(), |(j, _)| j);
                let group = &group[..end];
                names.extend(group.split(|c: char| !word(c) && c != '*').filter(|s| !s.is_empty()).map(String::from));
            }
            None if rest.starts_with('*') => names.push("*".into()),
            None => names.push(rest.chars().take_while(|&c| word(c)).collect()),
        }
    }
    names
}

#[test]
fn the_jobs_hold_no_judgement() {
    let exported = exports(&std::fs::read_to_string(repo("src/judge/mod.rs")).unwrap());
    for name in WHAT_JOBS_READ_OF_THE_JUDGE {
        assert!(
            exported.iter().any(|e| e == name),
            "judge exports no {name}: drop it from WHAT_JOBS_READ_OF_THE_JUDGE"
        );
    }
    let internals: Vec<&String> =
        exported.iter().filter(|e| !WHAT_JOBS_READ_OF_THE_JUDGE.contains(&e.as_str())).collect();
    // The judge's own machinery, as mod.rs exports it, is what the jobs must not name.
    for known in ["Comparer", "compare", "diagnose", "diagnose_big_batch", "caution", "needless_sync", "costs"] {
        assert!(internals.iter().any(|e| *e == known), "{known} not among the judge's exports: {exported:?}");
    }
    let mut files = Vec::new();
    rust_files(&repo("src/jobs"), &mut files);
    let mut named = Vec::new();
    for file in files {
        for name in names_from_the_judge(&std::fs::read_to_string(&file).unwrap()) {
            if name == "*" || internals.iter().any(|e| **e == name) {
                named.push(format!("{} names judge::{name}", file.strip_prefix(repo("src")).unwrap().display()));
            }
        }
    }
    assert!(
        named.is_empty(),
        "judgement in the jobs (judge::judge judges; the jobs load and report):\n{}",
        named.join("\n")
    );
}

#[test]
fn the_judges_names_are_read_from_paths_and_groups() {
    let text = "use crate::judge::{caution, diagnose::{Context, Loss}, Outcome};\nlet c = judge::Comparer::new();\n\
                let o = crate::judge::judge(legs); // prejudge::x\nuse crate::judge::*;";
    assert_eq!(
        names_from_the_judge(text),
        ["caution", "diagnose", "Context", "Loss", "Outcome", "Comparer", "judge", "*"]
    );
    let text =
        "pub use a::{b as c, D};\npub use e::f;\npub use g::{\n    h,\n    I,\n};\npub fn j() {}\npub enum K {}\n\
                impl K {\n    pub fn method() {}\n}";
    assert_eq!(exports(text), ["c", "D", "f", "h", "I", "j", "K"]);
}

/// The diagnosis's locators read facts and measure; none uses another (what they share is in
/// `measure`), so a new locator is a function in its family's file and a line in the tier
/// table (`locate/mod.rs`).
#[test]
fn no_locator_uses_another() {
    let graph = sibling_graph(&repo("src/judge/diagnose/locate"), "judge::diagnose::locate");
    assert!(graph.len() >= 8, "{graph:?}");
    let linked: Vec<String> =
        graph.iter().filter(|(_, u)| !u.is_empty()).map(|(n, u)| format!("{n} uses {}", u.join(", "))).collect();
    assert!(linked.is_empty(), "locators that use one another:\n{}", linked.join("\n"));
}

/// Words are written in one place: of the diagnosis's files, only `advise/` formats a cause,
/// `owner.rs` an owner's name and `mod.rs` where a cause sits; locators, measures and the
/// owner rule hand on facts.
#[test]
fn only_advise_writes_a_cause() {
    let root = repo("src/judge/diagnose");
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let allowed = |rel: &Path| rel.starts_with("advise") || rel == Path::new("owner.rs") || rel == Path::new("mod.rs");
    let tests = |rel: &Path| rel.to_str().is_some_and(|r| r.ends_with("tests.rs"));
    let mut wrote = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(&root).unwrap();
        if allowed(rel) || tests(rel) {
            continue;
        }
        let text = std::fs::read_to_string(file).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap();
        if code.contains("format!(") {
            wrote.push(rel.display().to_string());
        }
    }
    assert!(files.len() > 15, "{files:?}");
    assert!(wrote.is_empty(), "words written outside advise/:\n{}", wrote.join("\n"));
}
