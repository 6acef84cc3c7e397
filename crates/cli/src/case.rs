//! A suite case's keys as the main command's flags: `acc-steps = 4` is `--acc-steps 4`,
//! `shuffle = true` is `--shuffle`. Parsed by the same definition as the command line, so
//! a key means exactly what its flag means.

use std::ffi::OsString;

use clap::error::{ContextKind, ContextValue};
use clap::{CommandFactory, Parser};

use crate::{Cli, RunArgs};

/// One key's value, as TOML gives it.
#[derive(Debug, Clone, PartialEq)]
pub enum CaseValue {
    Bool(bool),
    Text(String),
}

/// Why a case's keys do not parse: the key at fault (when clap names one) and clap's line.
#[derive(Debug, PartialEq)]
pub struct CaseError {
    pub key: Option<String>,
    pub problem: String,
}

/// Keys that take no value (`shuffle = true`), and keys that take one.
pub fn case_keys() -> (Vec<String>, Vec<String>) {
    let cmd = Cli::command();
    let (mut switches, mut valued) = (Vec::new(), Vec::new());
    for arg in cmd.get_arguments() {
        let Some(long) = arg.get_long().filter(|l| !["help", "version"].contains(l)) else { continue };
        match arg.get_action().takes_values() {
            true => valued.push(long.to_string()),
            false => switches.push(long.to_string()),
        }
    }
    (switches, valued)
}

/// The main command's flags from a case's keys (in order); `key = false` leaves a switch off.
pub fn parse_case(keys: &[(String, CaseValue)]) -> Result<RunArgs, CaseError> {
    let (switches, valued) = case_keys();
    let mut argv = vec![OsString::from("ddp-verify")];
    for (key, value) in keys {
        let is_switch = switches.contains(key);
        if !is_switch && !valued.contains(key) {
            return Err(CaseError { key: Some(key.clone()), problem: "not a flag of ddp-verify".into() });
        }
        match (value, is_switch) {
            (CaseValue::Bool(true), true) => argv.push(format!("--{key}").into()),
            (CaseValue::Bool(false), true) => {}
            (CaseValue::Text(v), false) => argv.extend([format!("--{key}").into(), v.into()]),
            (_, true) => {
                return Err(CaseError { key: Some(key.clone()), problem: "is a switch: write true or false".into() })
            }
            (CaseValue::Bool(_), false) => {
                return Err(CaseError { key: Some(key.clone()), problem: "takes a value, not true or false".into() })
            }
        }
    }
    let cli = Cli::try_parse_from(argv).map_err(|e| {
        let key = match e.get(ContextKind::InvalidArg) {
            Some(ContextValue::String(arg)) => arg.trim_start_matches("--").split([' ', '=', '<']).next(),
            _ => None,
        };
        let text = e.render().to_string();
        let first = text.lines().next().unwrap_or_default().trim_start_matches("error: ").trim().to_string();
        CaseError { key: key.map(str::to_string), problem: first }
    })?;
    Ok(cli.run)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(k: &str, v: &str) -> (String, CaseValue) {
        (k.into(), CaseValue::Text(v.into()))
    }

    #[test]
    fn keys_are_the_long_flags() {
        let run = parse_case(&[
            text("acc-steps", "4"),
            text("gpus", "2"),
            ("shuffle".into(), CaseValue::Bool(true)),
            ("drop-last".into(), CaseValue::Bool(false)),
        ])
        .unwrap();
        assert_eq!((run.shape.acc_steps, run.shape.gpus, run.shape.shuffle, run.shape.drop_last), (4, 2, true, false));
    }

    #[test]
    fn a_bad_key_or_value_names_the_key() {
        let key = |keys: &[(String, CaseValue)]| parse_case(keys).err().expect("refused").key;
        assert_eq!(key(&[text("acc-step", "4")]), Some("acc-step".into()));
        assert_eq!(key(&[text("gpus", "two")]), Some("gpus".into()));
        assert_eq!(key(&[text("shuffle", "yes")]), Some("shuffle".into()));
        assert_eq!(key(&[("gpus".into(), CaseValue::Bool(true))]), Some("gpus".into()));
        assert_eq!(key(&[text("model", "resnet50")]), Some("model".into()));
    }
}
