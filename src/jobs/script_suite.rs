//! `suite FILE.toml` of a user's script's cases: each run as `ddp-verify -- COMMAND` runs
//! it, one after another, one verdict per case in one report. No ranks of ours: the legs are
//! the script's own processes, so the wheel's build runs it too (a gate keeps explore's
//! shrunk failures as cases).

use std::time::Instant;

use crate::error::{Error, Exit, Result};
use crate::report::suite::{CaseResult, SuiteReport};
use crate::spec::ScriptSuite;

pub fn command(suite: &ScriptSuite) -> Result<Exit> {
    let started = Instant::now();
    let mut cases = Vec::new();
    for (i, case) in suite.cases.iter().enumerate() {
        let t0 = Instant::now();
        // Cases are one node's (lowering refuses --nnodes), so the legs are judged here.
        let outcome = match super::script::run(&case.options) {
            Ok(Some(o)) => o,
            Ok(None) => {
                return Err(Error::Launcher {
                    problem: format!("suite case '{}' was judged on another node", case.name),
                    fix: "give suite cases one node's command".into(),
                })
            }
            Err(e @ (Error::Launcher { .. } | Error::BadFlag { .. })) => {
                return Err(Error::Launcher {
                    problem: format!("suite case '{}': {e}", case.name),
                    fix: "fix the case, or run it alone with the command its report gives".into(),
                })
            }
            Err(e) => return Err(e),
        };
        let o = &case.options;
        let command = rerun(&case.command, o);
        let result = CaseResult::of_script(&case.name, command, o.gpus, &outcome, t0.elapsed().as_secs_f64());
        eprintln!("{}", result.progress_line(i, suite.cases.len()));
        cases.push(result);
    }
    let report = SuiteReport {
        file: suite.file.clone(),
        ranks: suite.cases.iter().map(|c| c.options.gpus).max().unwrap_or(1),
        cases,
        seconds: started.elapsed().as_secs_f64(),
        start_seconds: None,
    };
    crate::report::suite::write_all(&report, &suite.reports)?;
    Ok(report.exit())
}

/// The case as one command: `ddp-verify --acc-steps K --gpus W --batch-size B -- COMMAND`,
/// its fills put in.
fn rerun(command: &[String], o: &crate::spec::ScriptOptions) -> String {
    format!(
        "ddp-verify --acc-steps {} --gpus {} --batch-size {} -- {}",
        o.acc_steps,
        o.gpus,
        o.batch_size,
        super::launcher::shell_words(&super::launcher::filled(command, &o.fills))
    )
}
