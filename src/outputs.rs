//! Whether an output can be written where it was asked for, checked before anything runs:
//! a verification that ran for minutes must not fail at its last step because a directory
//! was missing or read-only (exit 2 naming the flag, nothing run or written).

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// `file` can be created (or, with `force`, replaced) by this process.
pub fn check_file(flag: &'static str, file: &Path, force: bool) -> Result<()> {
    match std::fs::metadata(file) {
        Ok(m) if m.is_dir() => {
            return Err(Error::bad_file(file, format!("{flag} names a directory, not a file"), "pass a file path"))
        }
        Ok(_) if !force => {
            return Err(Error::bad_file(
                file,
                format!("{flag} would overwrite this file"),
                "choose another path or pass --force",
            ))
        }
        _ => {}
    }
    let parent = file.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    check_dir(flag, parent, false)
}

/// Files can be created in `dir`; when `create` it may not exist yet, and then its
/// nearest existing ancestor must take a new directory.
pub fn check_dir(flag: &'static str, dir: &Path, create: bool) -> Result<()> {
    let mut at: PathBuf = dir.to_path_buf();
    while create && !at.exists() {
        match at.parent().filter(|p| !p.as_os_str().is_empty()) {
            Some(p) => at = p.to_path_buf(),
            None => at = PathBuf::from("."),
        }
    }
    match std::fs::metadata(&at) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(Error::bad_file(&at, format!("{flag}: not a directory"), "pass a directory path")),
        Err(_) => return Err(Error::bad_file(&at, format!("{flag}: no such directory"), "create it first")),
    }
    // Permissions alone do not tell (root, read-only mounts, /proc): try.
    let probe = at.join(format!(".ddp-verify-probe-{}", std::process::id()));
    match std::fs::OpenOptions::new().write(true).create_new(true).open(&probe) {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            Ok(())
        }
        Err(e) => Err(Error::bad_file(&at, format!("{flag}: cannot write here ({e})"), "choose a writable directory")),
    }
}

/// The same file asked for twice would leave only one of the outputs.
pub fn check_distinct<'a>(paths: impl IntoIterator<Item = (&'static str, &'a Path)>) -> Result<()> {
    let mut seen: Vec<(&'static str, PathBuf)> = Vec::new();
    for (flag, p) in paths {
        let key = std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
        if let Some((first, _)) = seen.iter().find(|(_, k)| *k == key) {
            return Err(Error::bad_file(
                p,
                format!("given to {first} and again to {flag}: one output would overwrite the other"),
                "give each output its own file",
            ));
        }
        seen.push((flag, key));
    }
    Ok(())
}
