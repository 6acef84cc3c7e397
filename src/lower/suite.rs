//! `suite FILE.toml`: its `[[case]]` tables, each named once; the cases of a user's own
//! script (`command = [...]`), which need no libtorch (the wheel's gate runs them), and our
//! own models' cases, lowered as the main command is (with libtorch).

use std::path::{Path, PathBuf};

use ddp_verify_cli::{parse_case, CaseValue, SuiteArgs};

#[cfg(feature = "libtorch")]
use crate::dist::world;
use crate::error::{Error, Result};
use crate::spec::{ScriptCase, ScriptSuite};
#[cfg(feature = "libtorch")]
use crate::spec::{Suite, SuiteCase};

const FIX: &str = "see examples/suite.toml";

/// The file's cases, by name, in file order: valid TOML of `[[case]]` tables only, each
/// with a name of its own.
pub fn suite_tables(file: &Path) -> Result<Vec<(String, toml::Table)>> {
    let text = std::fs::read_to_string(file).map_err(|e| match file.is_file() {
        true => Error::bad_file(file, format!("cannot be read ({e})"), FIX),
        false => Error::bad_file(file, format!("suite file {}", crate::error::what_is(file)), FIX),
    })?;
    let top: toml::Table = text.parse().map_err(|e: toml::de::Error| {
        Error::bad_file(file, format!("not valid TOML: {}", e.message().lines().next().unwrap_or_default()), FIX)
    })?;
    if let Some(key) = top.keys().find(|k| *k != "case") {
        return Err(Error::bad_file(file, format!("unknown top-level key '{key}'"), "list cases as [[case]] tables"));
    }
    let Some(toml::Value::Array(tables)) = top.get("case") else {
        return Err(Error::bad_file(file, "no [[case]] tables", "add at least one [[case]] with a name"));
    };
    let mut cases: Vec<(String, toml::Table)> = Vec::new();
    for (i, table) in tables.iter().enumerate() {
        let Some(table) = table.as_table() else {
            return Err(Error::bad_file(file, format!("case {} is not a table", i + 1), "write [[case]] tables"));
        };
        let name = match table.get("name") {
            Some(toml::Value::String(n)) if !n.trim().is_empty() => n.clone(),
            _ => return Err(Error::bad_file(file, format!("case {} has no name", i + 1), "add name = \"...\"")),
        };
        if cases.iter().any(|(c, _)| *c == name) {
            return Err(Error::bad_file(file, format!("two cases are named '{name}'"), "give each case its own name"));
        }
        cases.push((name, table.clone()));
    }
    Ok(cases)
}

/// A key's TOML value as a flag's; else (problem, fix).
pub fn case_value(v: &toml::Value) -> std::result::Result<CaseValue, (String, String)> {
    Ok(match v {
        toml::Value::Boolean(b) => CaseValue::Bool(*b),
        toml::Value::String(v) => CaseValue::Text(v.clone()),
        toml::Value::Integer(v) => CaseValue::Text(v.to_string()),
        toml::Value::Float(v) => CaseValue::Text(v.to_string()),
        other => {
            return Err((
                format!("a {} is not a flag's value", other.type_str()),
                "write a number, a string or true/false".into(),
            ))
        }
    })
}

#[cfg(feature = "libtorch")]
/// Keys a suite case may not set: the suite writes one report for all cases, and only checks.
const SUITE_OWNS: [(&str, &str); 5] = [
    ("report", "the suite writes one report for every case: pass --report to ddp-verify suite"),
    ("report-file", "the suite writes one report for every case: pass --report-file to ddp-verify suite"),
    ("plot", "a suite draws no plots: rerun the case alone with --plot"),
    ("bless", "a suite only checks: bless with a single run"),
    ("timeout", "the suite has one deadline for all its cases: pass --timeout to ddp-verify suite"),
];

#[cfg(feature = "libtorch")]
/// `suite FILE.toml`: every case read, lowered like the command line and preflighted, so
/// an invalid case stops the suite before any rank starts, naming the case and the key.
pub fn suite(args: &SuiteArgs) -> Result<Suite> {
    let file = &args.file;
    let mut cases: Vec<SuiteCase> = Vec::new();
    for (name, table) in suite_tables(file)? {
        let refuse = |key: &str, problem: String, fix: String| {
            Error::bad_file(file, format!("case '{name}', key {key}: {problem}"), fix)
        };
        let mut keys = Vec::new();
        for (key, value) in table.iter().filter(|(k, _)| *k != "name") {
            if key == "command" || key == "fills" {
                let problem =
                    "belongs to a case of your own script; this suite's other cases train ddp-verify's models";
                return Err(refuse(key, problem.into(), "put your scripts' cases in a suite file of their own".into()));
            }
            if let Some((_, why)) = SUITE_OWNS.iter().find(|(k, _)| k == key) {
                return Err(refuse(key, "not allowed in a suite".into(), why.to_string()));
            }
            keys.push((key.clone(), case_value(value).map_err(|p| refuse(key, p.0, p.1))?));
        }
        let mut run = parse_case(&keys).map_err(|e| {
            let key = e.key.unwrap_or_else(|| "-".into());
            refuse(&key, e.problem, "see ddp-verify --help for the flag's values".into())
        })?;
        // The suite's --kernels is every case's, unless the case names its own.
        run.kernels.kernels = run.kernels.kernels.or(args.kernels.kernels);
        let config = super::verification(&run).map_err(|e| in_case(file, &name, e))?;
        cases.push(SuiteCase { name, config });
    }
    // One process computes every case: one kernel mode, pinned before any case's preflight
    // reads a tensor.
    let mode = match args.kernels.kernels {
        Some(k) => k,
        None => cases.first().map(|c| c.config.kernels).unwrap_or_default(),
    };
    if let Some(c) = cases.iter().find(|c| c.config.kernels != mode) {
        return Err(Error::bad_file(
            file,
            format!(
                "case '{}' computes with {} kernels, the suite with {}",
                c.name,
                c.config.kernels.name(),
                mode.name()
            ),
            "give every case the same kernels (their goldens' mode), or run them as separate suites",
        ));
    }
    let device = cases.first().map(|c| c.config.train.run.device).unwrap_or_default();
    crate::dist::kernels::apply(mode, device)?;
    for case in &cases {
        crate::jobs::preflight(&case.config).map_err(|e| in_case(file, &case.name, e))?;
    }
    let reports = super::reports(&args.reports)?;
    crate::report::check_targets(&reports, None, args.force)?;
    Ok(Suite { file: file.clone(), cases, reports, timeout_s: args.timeout, progress: world::progress_wanted() })
}

/// Whether the file's cases are a user's script's (any has a `command`). An unreadable file
/// is left to the suite that reads it to refuse.
pub fn is_script_suite(file: &Path) -> bool {
    suite_tables(file).is_ok_and(|cases| cases.iter().any(|(_, t)| t.contains_key("command")))
}

/// The flags a script's case may set, beside `command` and `fills`.
const SCRIPT_KEYS: [&str; 7] = ["acc-steps", "gpus", "batch-size", "sample", "max-ulps", "rtol", "atol"];

/// A suite of a user's script's cases: each lowered as `ddp-verify [flags] -- COMMAND` is,
/// its `fills` (a table: {NAME} in the command → its value) checked against the command.
pub fn script_suite(args: &SuiteArgs) -> Result<ScriptSuite> {
    let file = &args.file;
    let tables = suite_tables(file)?;
    if !tables.iter().any(|(_, t)| t.contains_key("command")) {
        return Err(Error::bad_file(
            file,
            "has no case with a command: its cases train ddp-verify's own models",
            crate::error::NEEDS_LIBTORCH,
        ));
    }
    let mut cases = Vec::new();
    for (name, table) in tables {
        let refuse = |key: &str, problem: String, fix: &str| {
            Error::bad_file(file, format!("case '{name}', key {key}: {problem}"), fix.to_string())
        };
        let command: Vec<String> = match table.get("command") {
            Some(toml::Value::Array(words)) if !words.is_empty() => {
                words.iter().map(|w| w.as_str().map(str::to_string)).collect::<Option<_>>().ok_or_else(|| {
                    refuse(
                        "command",
                        "has a word that is not a string".into(),
                        "write command = [\"python\", \"train.py\", ...]",
                    )
                })?
            }
            Some(_) => {
                return Err(refuse(
                    "command",
                    "is not a list of words".into(),
                    "write command = [\"python\", \"train.py\", ...]",
                ))
            }
            None => {
                return Err(refuse(
                    "command",
                    "is missing, where the suite's other cases run your script".into(),
                    "give every case a command, or put ddp-verify's own models' cases in a suite of their own",
                ))
            }
        };
        let mut keys = Vec::new();
        let mut fills = Vec::new();
        for (key, value) in table.iter().filter(|(k, _)| !matches!(k.as_str(), "name" | "command")) {
            if key == "fills" {
                let Some(t) = value.as_table() else {
                    return Err(refuse(key, "is not a table".into(), "write fills = { data_size = 6 }"));
                };
                for (k, v) in t {
                    let v = match case_value(v) {
                        Ok(CaseValue::Text(v)) => v,
                        _ => {
                            return Err(refuse(
                                key,
                                format!("{k} is not a number or a string"),
                                "write fills = { data_size = 6 }",
                            ))
                        }
                    };
                    if !command.iter().any(|w| w.contains(&format!("{{{k}}}"))) {
                        return Err(refuse(
                            key,
                            format!("the command has no {{{k}}}"),
                            "fill only the command's own placeholders",
                        ));
                    }
                    fills.push((k.clone(), v));
                }
                continue;
            }
            if !SCRIPT_KEYS.contains(&key.as_str()) {
                return Err(refuse(
                    key,
                    "is not a key of a script's case".into(),
                    "use command, fills, acc-steps, gpus, batch-size, sample, max-ulps, rtol or atol",
                ));
            }
            keys.push((key.clone(), case_value(value).map_err(|p| refuse(key, p.0, &p.1))?));
        }
        let mut run = parse_case(&keys).map_err(|e| {
            let key = e.key.unwrap_or_else(|| "-".into());
            refuse(&key, e.problem, "see ddp-verify --help for the flag's values")
        })?;
        run.script = command.clone();
        let mut options = super::script(&run).map_err(|e| in_case(file, &name, e))?;
        if options.launcher.nodes > 1 {
            return Err(refuse(
                "command",
                format!("spans {} nodes; a suite runs its cases on this machine", options.launcher.nodes),
                "give the case a one-node command, and check the nodes with ddp-verify -- COMMAND",
            ));
        }
        options.fills = fills;
        options.quiet = true;
        cases.push(ScriptCase { name, command, options });
    }
    let reports = super::reports(&args.reports)?;
    crate::report::check_targets(&reports, None, args.force)?;
    Ok(ScriptSuite { file: PathBuf::from(file), cases, reports })
}

/// A case's refusal, naming the file, the case and its key.
fn in_case(file: &Path, name: &str, e: Error) -> Error {
    match e {
        Error::BadFlag { flag, problem, fix } => {
            Error::bad_file(file, format!("case '{name}', key {}: {problem}", flag.trim_start_matches("--")), fix)
        }
        Error::BadFile { path, problem, fix } => {
            Error::bad_file(file, format!("case '{name}': {}: {problem}", path.display()), fix)
        }
        other => other,
    }
}
