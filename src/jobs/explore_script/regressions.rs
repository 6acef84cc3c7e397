//! Shrunk failures of users' commands, kept in explore's regressions file beside our own
//! models' (one JSON line each, told apart by their "command"), replayed first next time.

use std::io::Write as _;
use std::path::Path;

use super::draw::Draw;
use crate::error::{Error, Result};

#[derive(serde::Serialize, serde::Deserialize)]
struct Kept {
    /// The command as given, placeholders and all.
    command: Vec<String>,
    #[serde(flatten)]
    draw: Draw,
}

/// Whether a line of the regressions file is a user's command's (ours are configurations).
pub fn is_script_line(line: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(line).is_ok_and(|v| v.get("command").is_some())
}

const FIX: &str = "fix or delete the file (explore writes one configuration as JSON per line)";

/// The file can be read, every command line in it is one, and it can be appended to:
/// checked before any case runs, so a finding is not lost at the end.
pub fn check_regressions(path: &Path) -> Result<()> {
    if path.is_dir() {
        return Err(Error::bad_file(path, "--regressions names a directory, not a file", "pass a file path"));
    }
    all(path)?;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    crate::outputs::check_dir("--regressions", dir, true)
}

fn all(path: &Path) -> Result<Vec<Kept>> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::bad_file(path, format!("--regressions cannot be read ({e})"), FIX))?;
    let mut kept = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| is_script_line(l)) {
        let k: Kept = serde_json::from_str(line).map_err(|e| {
            Error::bad_file(path, format!("--regressions line {} is not a command's configuration ({e})", i + 1), FIX)
        })?;
        kept.push(k);
    }
    Ok(kept)
}

/// The draws kept for this command, in file order.
pub fn read(path: &Path, command: &[String]) -> Result<Vec<Draw>> {
    Ok(all(path)?.into_iter().filter(|k| k.command == command).map(|k| k.draw).collect())
}

/// Appends a shrunk failure, unless the file already holds it.
pub fn append(path: &Path, command: &[String], draw: &Draw) -> Result<bool> {
    if read(path, command)?.contains(draw) {
        return Ok(false);
    }
    let kept = Kept { command: command.to_vec(), draw: draw.clone() };
    append_line(path, &serde_json::to_string(&kept).expect("a draw serialises"))?;
    Ok(true)
}

/// Appends one JSON line to the regressions file (our models' configurations and users'
/// commands' alike), with the file's heading when it is new; a failure to write is an
/// error, not a finding lost in silence.
pub fn append_line(path: &Path, line: &str) -> Result<()> {
    let io = |e| Error::io(format!("appending to {}", path.display()), e);
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let fresh = !path.exists();
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(io)?;
    let mut text = String::new();
    if fresh {
        text.push_str("# Minimal configurations ddp-verify explore found not equivalent; replayed first.\n");
    }
    text.push_str(line);
    text.push('\n');
    f.write_all(text.as_bytes()).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_draws_come_back_for_their_command_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.txt");
        std::fs::write(&path, "{\"data_size\":8}\n").unwrap(); // one of our own models' lines
        let cmd = vec!["python".to_string(), "t.py".to_string(), "{acc_steps}".to_string()];
        let d =
            Draw { gpus: 2, acc_steps: 2, batch: Some(1), data_size: Some(3), seed: None, axes: Default::default() };
        assert!(append(&path, &cmd, &d).unwrap());
        assert!(!append(&path, &cmd, &d).unwrap(), "kept once");
        assert_eq!(read(&path, &cmd).unwrap(), [d]);
        assert!(read(&path, &cmd[..2]).unwrap().is_empty());
        check_regressions(&path).unwrap();
        std::fs::write(&path, "{\"command\": 3}\n").unwrap();
        assert!(check_regressions(&path).unwrap_err().to_string().contains("line 1"));
    }
}
