//! The regressions file: minimal failures kept as proptest keeps its regressions, but as the
//! cases themselves, one JSON line each, replayed first next time. Both subjects share it:
//! our models' lines are configurations (`TrainConfig`), a user's script's carry the command
//! (`{"command": [...], ...draw}`). One reader, one writer, one fix.

use std::io::Write as _;
use std::path::Path;

use crate::error::{Error, Result};
use crate::spec::{Draw, TrainConfig};

const FIX: &str = "fix or delete the file (explore writes one configuration as JSON per line)";
const HEADING: &str = "# Minimal configurations ddp-verify explore found not equivalent; replayed first.";

/// One line of the file.
#[derive(Clone, Debug, PartialEq)]
pub enum Line {
    /// One of our models' configurations.
    Config(Box<TrainConfig>),
    /// A configuration of a user's command.
    Script(ScriptLine),
}

/// A user's command's line: the command as given (placeholders and all), beside its draw.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ScriptLine {
    pub command: Vec<String>,
    #[serde(flatten)]
    pub draw: Draw,
}

/// The file can be read, every line in it is one of the two kinds, and it can be appended
/// to: checked before any case runs, so a finding is not lost at the end.
pub fn check_regressions(path: &Path) -> Result<()> {
    if path.is_dir() {
        return Err(Error::bad_file(path, "--regressions names a directory, not a file", "pass a file path"));
    }
    read(path)?;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    crate::outputs::check_dir("--regressions", dir, true)
}

/// Every line kept, in file order (none without the file); a line of neither kind is
/// refused (exit 2), never skipped in silence. Comments and blank lines are not lines.
pub fn read(path: &Path) -> Result<Vec<Line>> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::bad_file(path, format!("--regressions cannot be read ({e})"), FIX))?;
    let kept = text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty() && !l.trim_start().starts_with('#'));
    kept.map(|(i, l)| {
        parse(l).map_err(|not| Error::bad_file(path, format!("--regressions line {} is not {not}", i + 1), FIX))
    })
    .collect()
}

/// A line by its kind: a user's command's when it has a "command", else a configuration.
fn parse(line: &str) -> std::result::Result<Line, String> {
    let theirs = serde_json::from_str::<serde_json::Value>(line).is_ok_and(|v| v.get("command").is_some());
    let not = |what: &'static str| move |e: serde_json::Error| format!("{what} ({e})");
    match theirs {
        true => serde_json::from_str(line).map(Line::Script).map_err(not("a command's configuration")),
        false => serde_json::from_str(line).map(|c| Line::Config(Box::new(c))).map_err(not("a configuration")),
    }
}

/// Appends a failure, unless the file holds it already (false then), with the file's
/// heading when it is new; a failure to write is an error, not a finding lost in silence.
pub fn append(path: &Path, line: &Line) -> Result<bool> {
    if read(path)?.contains(line) {
        return Ok(false);
    }
    let json = match line {
        Line::Config(cfg) => serde_json::to_string(&**cfg),
        Line::Script(s) => serde_json::to_string(s),
    };
    let io = |e| Error::io(format!("appending to {}", path.display()), e);
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let fresh = !path.exists();
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(io)?;
    let mut text = String::new();
    if fresh {
        text.push_str(HEADING);
        text.push('\n');
    }
    text.push_str(&json.expect("a kept case serialises"));
    text.push('\n');
    f.write_all(text.as_bytes()).map_err(io)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn script(command: &[String], draw: &Draw) -> Line {
        Line::Script(ScriptLine { command: command.to_vec(), draw: draw.clone() })
    }

    /// Both kinds of line in one file, each read back as itself, each kept once.
    #[test]
    fn both_kinds_are_read_back_and_kept_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.txt");
        let mut ours = TrainConfig::article();
        ours.shape.data_size += 1;
        std::fs::write(&path, serde_json::to_string(&ours).unwrap() + "\n").unwrap();
        let cmd = vec!["python".to_string(), "t.py".to_string(), "{acc_steps}".to_string()];
        let d =
            Draw { gpus: 2, acc_steps: 2, batch: Some(1), data_size: Some(3), seed: None, axes: Default::default() };
        assert!(append(&path, &script(&cmd, &d)).unwrap());
        assert!(!append(&path, &script(&cmd, &d)).unwrap(), "kept once");
        let lines = read(&path).unwrap();
        assert!(matches!(&lines[0], Line::Config(c) if **c == ours), "{lines:?}");
        assert_eq!(lines[1], script(&cmd, &d));
        let cfg = Line::Config(Box::new(TrainConfig::article()));
        assert!(append(&path, &cfg).unwrap());
        assert!(!append(&path, &cfg).unwrap(), "kept once");
        assert_eq!(read(&path).unwrap()[2], cfg);
        check_regressions(&path).unwrap();
    }

    /// A line of neither kind is refused naming it, whichever subject reads the file.
    #[test]
    fn a_line_of_neither_kind_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.txt");
        for (text, says) in [
            ("# heading\n{\"command\": 3}\n", "line 2 is not a command's configuration"),
            ("\n{\"data_size\": \"x\"}\n", "line 2 is not a configuration"),
            ("not json\n", "line 1 is not a configuration"),
        ] {
            std::fs::write(&path, text).unwrap();
            let err = check_regressions(&path).unwrap_err().to_string();
            assert!(err.contains(says) && err.contains(FIX), "{text}: {err}");
        }
        let err = check_regressions(dir.path()).unwrap_err().to_string();
        assert!(err.contains("names a directory"), "{err}");
    }
}
