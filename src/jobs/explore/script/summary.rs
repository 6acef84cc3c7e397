//! What explore tells: a line per case, the summary with the smallest failure as a
//! runnable command and as a suite case, and the quoting both need.

use super::{Case, Ended, Found};
use crate::jobs::launcher::{filled, shell_words};
use crate::spec::{Draw, ScriptExplore};

pub(super) fn words(e: &Ended) -> String {
    match e {
        Ended::Equivalent => "EQUIVALENT".into(),
        Ended::NotEquivalent => "NOT EQUIVALENT".into(),
        Ended::NoVerdict => "NO VERDICT".into(),
        Ended::DidNotRun(why) => format!("did not run: {why}"),
    }
}

/// The `ddp-verify` command that checks this one configuration again: K, W and B as flags,
/// the drawn placeholders filled in, ddp-verify's own left for it to fill.
pub(super) fn rerun_command(x: &ScriptExplore, d: &Draw) -> String {
    let mut argv = vec!["ddp-verify".to_string(), "--acc-steps".into(), d.acc_steps.to_string()];
    argv.extend(["--gpus".into(), d.gpus.to_string()]);
    if let Some(b) = d.batch {
        argv.extend(["--batch-size".into(), b.to_string()]);
    }
    argv.push("--".into());
    argv.extend(filled(&x.command, &d.fills()));
    shell_words(&argv)
}

/// The configuration as a `[[case]]` table of a script's suite (docs/explore-script.md).
pub fn suite_case(command: &[String], d: &Draw) -> String {
    let q = |v: &str| serde_json::to_string(v).expect("a string serialises");
    let words: Vec<String> = command.iter().map(|w| q(w)).collect();
    let mut s =
        format!("[[case]]\nname = {}\ncommand = [{}]\n", q(&format!("explore: {}", d.short())), words.join(", "));
    s.push_str(&format!("acc-steps = {}\ngpus = {}\n", d.acc_steps, d.gpus));
    if let Some(b) = d.batch {
        s.push_str(&format!("batch-size = {b}\n"));
    }
    let fills: Vec<String> = d.fills().iter().map(|(k, v)| format!("{k} = {}", q(v))).collect();
    if !fills.is_empty() {
        s.push_str(&format!("fills = {{ {} }}\n", fills.join(", ")));
    }
    s
}

pub(super) fn text(f: &Found) -> String {
    let mut s = format!(
        "explore: {} configurations of your command tried in {:.1} s ({} drawn, {} replayed, {} shrinking), seed {}\n",
        f.cases.len(),
        f.seconds,
        f.drawn,
        f.replayed,
        f.shrink_runs,
        f.seed
    );
    if f.stopped_by_max_time {
        s.push_str("explore: stopped by --max-time\n");
    }
    let failed: Vec<&Case> = f.cases.iter().filter(|c| matches!(c.ended, Ended::DidNotRun(_))).collect();
    for c in &failed {
        if let Ended::DidNotRun(why) = &c.ended {
            s.push_str(&format!("did not run at {}: {why}\n", c.draw.short()));
        }
    }
    match (&f.smallest, &f.rerun) {
        (Some(c), Some(cmd)) => {
            s.push_str(&format!("NOT EQUIVALENT; the smallest configuration found: {}\n  {cmd}\n", c.draw.short()));
            s.push_str(&format!("  cause: {}\n", c.cause.as_deref().unwrap_or("not named")));
            if let Some(dir) = &c.dir {
                s.push_str(&format!("  its traces and logs: {}\n", dir.display()));
            }
            if let Some(p) = &f.kept_in {
                s.push_str(&format!("  kept in {} (replayed first next time)\n", p.display()));
            }
            s.push_str("  as a case of `ddp-verify suite FILE.toml`:\n");
            for line in suite_case(&f.command, &c.draw).lines() {
                s.push_str(&format!("    {line}\n"));
            }
        }
        _ => {
            let judged = f.cases.iter().filter(|c| c.ended == Ended::Equivalent).count();
            s.push_str(&format!("EQUIVALENT in all {judged} configurations judged{}\n", range(&f.cases)));
        }
    }
    s
}

/// " (W 2..3, K 2..9, N 3..40)": what the configurations spanned.
fn range(cases: &[Case]) -> String {
    let span = |name: &str, v: Vec<usize>| match (v.iter().min(), v.iter().max()) {
        (Some(a), Some(b)) if a == b => format!("{name}={a}"),
        (Some(a), Some(b)) => format!("{name} {a}..{b}"),
        _ => String::new(),
    };
    let parts = [
        span("W", cases.iter().map(|c| c.draw.gpus).collect()),
        span("K", cases.iter().map(|c| c.draw.acc_steps).collect()),
        span("B", cases.iter().filter_map(|c| c.draw.batch).collect()),
        span("N", cases.iter().filter_map(|c| c.draw.data_size).collect()),
    ];
    let parts: Vec<String> = parts.into_iter().filter(|p| !p.is_empty()).collect();
    match parts.is_empty() {
        true => String::new(),
        false => format!(" ({})", parts.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shrunk configuration printed as a suite case is valid TOML that a script's suite
    /// reads back: its command, K, W, B and fills.
    #[test]
    fn a_found_configuration_is_a_suite_case() {
        let command: Vec<String> =
            ["python", "t.py", "--n", "{data_size}", "--note", "it's \"x\""].map(String::from).into();
        let d =
            Draw { gpus: 2, acc_steps: 4, batch: Some(3), data_size: Some(7), seed: None, axes: Default::default() };
        let t: toml::Table = toml::from_str(&suite_case(&command, &d)).unwrap();
        let case = &t["case"].as_array().unwrap()[0];
        let words: Vec<&str> = case["command"].as_array().unwrap().iter().map(|w| w.as_str().unwrap()).collect();
        assert_eq!(words, command);
        assert_eq!((case["acc-steps"].as_integer(), case["gpus"].as_integer()), (Some(4), Some(2)));
        assert_eq!(case["fills"]["data_size"].as_str(), Some("7"));
    }
}
