//! The working folder the legs share. A leg's files (checkpoints, an output directory) would
//! be the next leg's input: a run resumed from the other leg's snapshot, or one that refuses
//! to start ("output directory already exists"). So the folder is listed around each leg,
//! and what a leg created is moved aside, under the trace folder, before the next leg
//! starts; nothing is deleted, and the folder ends as the last leg left it. A file that was
//! there before and that a leg changed cannot be given back as it was: that is said.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

/// Set to 1, the legs share the working folder as it is, unwatched: for a caller that runs
/// several checks at once in one folder (each would move the others' files aside), as the
/// test suite does.
pub const SHARE_FOLDER_ENV: &str = "DDP_VERIFY_SHARE_FOLDER";

/// A listing longer than this (a huge tree) stops the watch: the legs then share the folder
/// as before, and the report says so.
const LISTING_BUDGET: Duration = Duration::from_secs(2);

/// Each entry under the folder: whether a directory, its modification time and length.
type Listing = BTreeMap<PathBuf, (bool, Option<SystemTime>, u64)>;

pub struct Folder {
    root: PathBuf,
    /// Where moved files go: `<trace folder>/files/<leg>/`.
    keep: PathBuf,
    /// Folders never listed (the trace folder itself).
    skip: Vec<PathBuf>,
    /// The listing before the leg under way, and the last leg's name with its listing after.
    before: Option<Listing>,
    after: Option<(String, Listing)>,
    moved: Vec<(String, PathBuf, Vec<PathBuf>)>,
    changed: Vec<(String, PathBuf)>,
    failed: Vec<String>,
    /// Why the folder is not watched, once it is not.
    off: Option<String>,
}

impl Folder {
    /// The current directory, where the legs run; `out` (the traces and logs) is left alone.
    pub fn watch(out: &Path) -> Folder {
        let root = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
        let abs = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        // Asked for by the caller, who knows: nothing to say.
        let off = std::env::var(SHARE_FOLDER_ENV).is_ok_and(|v| v == "1").then(String::new);
        Folder {
            keep: out.join("files"),
            skip: vec![abs(out)],
            root: abs(&root),
            before: None,
            after: None,
            moved: Vec::new(),
            changed: Vec::new(),
            failed: Vec::new(),
            off,
        }
    }

    /// Before leg `leg` starts: the last leg's new files moved aside, then the folder listed.
    pub fn before(&mut self, leg: &str) {
        if self.off.is_some() {
            return;
        }
        if let (Some((last, after)), Some(before)) = (self.after.take(), self.before.take()) {
            self.move_aside(&last, leg, &before, &after);
        }
        self.before = self.list();
    }

    /// After leg `leg` ended: the folder listed again.
    pub fn after(&mut self, leg: &str) {
        if self.off.is_some() {
            return;
        }
        self.after = self.list().map(|l| (leg.to_string(), l));
    }

    /// What was done, in words, for the report.
    pub fn finish(&self, notes: &mut Vec<String>) {
        if let Some(why) = self.off.as_ref().filter(|w| !w.is_empty()) {
            notes.push(why.clone());
        }
        if self.off.is_some() {
            return;
        }
        for (leg, keep, paths) in &self.moved {
            let shown: Vec<String> = paths.iter().take(8).map(|p| p.display().to_string()).collect();
            let more = if paths.len() > 8 { format!(" and {} more", paths.len() - 8) } else { String::new() };
            notes.push(format!(
                "the {leg} leg's new files in the working folder were moved aside before the next leg started, \
                 into {}: {}{more} (the folder ends as the last leg left it)",
                keep.display(),
                shown.join(", ")
            ));
        }
        for (leg, path) in &self.changed {
            notes.push(format!(
                "{} was in the working folder before the check and the {leg} leg changed it: the next leg read \
                 the {leg} leg's version (give each leg its own path, e.g. --output_dir out/{{leg}})",
                path.display()
            ));
        }
        notes.extend(self.failed.iter().cloned());
    }

    /// Moves what leg `last` created (the topmost new entries) into `keep/last`, and notes
    /// files it changed.
    fn move_aside(&mut self, last: &str, next: &str, before: &Listing, after: &Listing) {
        let new: Vec<&PathBuf> = after
            .keys()
            .filter(|p| !before.contains_key(*p))
            .filter(|p| p.parent().is_none_or(|up| up.as_os_str().is_empty() || before.contains_key(up)))
            .collect();
        for (p, (dir, time, len)) in after {
            if let Some((_, t0, l0)) = before.get(p).filter(|(d, ..)| !d && !dir) {
                if (t0, l0) != (time, len) && !self.changed.iter().any(|(_, q)| q == p) {
                    self.changed.push((last.to_string(), p.clone()));
                }
            }
        }
        let mut moved = Vec::new();
        // A folder of its own: an earlier check's (--force) is never written into.
        let keep = (1..).map(|n| match n {
            1 => self.keep.join(last),
            n => self.keep.join(format!("{last}-{n}")),
        });
        let keep = keep.take(1000).find(|k| !k.exists()).unwrap_or_else(|| self.keep.join(last));
        for rel in new {
            let to = keep.join(rel);
            let from = self.root.join(rel);
            match move_path(&from, &to) {
                Ok(()) => moved.push(rel.clone()),
                Err(e) => self.failed.push(format!(
                    "{} (made by the {last} leg) could not be moved aside ({e}): the {next} leg saw it",
                    from.display()
                )),
            }
        }
        if !moved.is_empty() {
            self.moved.push((last.to_string(), keep, moved));
        }
    }

    /// The folder's entries, relative to it; None (and the watch off) past the budget.
    fn list(&mut self) -> Option<Listing> {
        let started = Instant::now();
        let mut out = Listing::new();
        let mut todo = vec![PathBuf::new()];
        while let Some(rel) = todo.pop() {
            if started.elapsed() > LISTING_BUDGET {
                self.off = Some(format!(
                    "the working folder {} holds too many files to list in {} s: the legs' files were not moved \
                     aside, so a leg may have read another's (give each leg its own output path, e.g. out/{{leg}})",
                    self.root.display(),
                    LISTING_BUDGET.as_secs()
                ));
                return None;
            }
            let Ok(entries) = std::fs::read_dir(self.root.join(&rel)) else { continue };
            for e in entries.flatten() {
                let Ok(meta) = e.metadata() else { continue };
                let name = e.file_name();
                let path = rel.join(&name);
                let abs = self.root.join(&path);
                if meta.is_dir() && skipped(&name, &abs, &self.skip) {
                    continue;
                }
                out.insert(path.clone(), (meta.is_dir(), meta.modified().ok(), meta.len()));
                if meta.is_dir() && !meta.file_type().is_symlink() {
                    todo.push(path);
                }
            }
        }
        Some(out)
    }
}

/// Folders no leg's outputs live in, and that may be huge: the trace folder, Python's
/// caches, version control, virtual environments, build caches (CACHEDIR.TAG: cargo's
/// target, pip's cache).
fn skipped(name: &std::ffi::OsStr, abs: &Path, skip: &[PathBuf]) -> bool {
    matches!(name.to_str(), Some("__pycache__" | ".git" | ".hg" | "node_modules"))
        || abs.join("pyvenv.cfg").is_file()
        || abs.join("CACHEDIR.TAG").is_file()
        || skip.iter().any(|s| std::fs::canonicalize(abs).is_ok_and(|a| a == *s))
}

/// Renames `from` to `to`, or (across file systems) copies it and then removes it.
fn move_path(from: &Path, to: &Path) -> std::io::Result<()> {
    if let Some(up) = to.parent() {
        std::fs::create_dir_all(up)?;
    }
    if to.exists() {
        return Err(std::io::Error::new(std::io::ErrorKind::AlreadyExists, format!("{} exists", to.display())));
    }
    if std::fs::rename(from, to).is_ok() {
        return Ok(());
    }
    copy_all(from, to)?;
    if from.is_dir() {
        std::fs::remove_dir_all(from)
    } else {
        std::fs::remove_file(from)
    }
}

fn copy_all(from: &Path, to: &Path) -> std::io::Result<()> {
    if from.is_dir() {
        std::fs::create_dir_all(to)?;
        for e in std::fs::read_dir(from)? {
            let e = e?;
            copy_all(&e.path(), &to.join(e.file_name()))?;
        }
        Ok(())
    } else {
        std::fs::copy(from, to).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A leg's new files go aside before the next leg, the changed one is named, and the
    /// trace folder inside the working folder is never touched.
    #[test]
    fn a_legs_new_files_are_moved_aside_and_nothing_is_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join("kept.txt"), "before").unwrap();
        let out = root.join("traces");
        std::fs::create_dir_all(&out).unwrap();
        let mut f = Folder::watch(&out);
        f.root = std::fs::canonicalize(root).unwrap();
        let mut notes = Vec::new();
        f.before("accumulation");
        std::fs::create_dir_all(root.join("checkpoints")).unwrap();
        std::fs::write(root.join("checkpoints/snapshot.pt"), "weights").unwrap();
        std::fs::write(root.join("kept.txt"), "changed by the leg").unwrap();
        std::fs::write(out.join("accumulation.log"), "log").unwrap();
        f.after("accumulation");
        f.before("ddp");
        assert!(!root.join("checkpoints").exists(), "the next leg must not see the first leg's checkpoint");
        assert_eq!(std::fs::read_to_string(out.join("files/accumulation/checkpoints/snapshot.pt")).unwrap(), "weights");
        assert!(out.join("accumulation.log").is_file(), "the trace folder is left alone");
        std::fs::create_dir_all(root.join("checkpoints")).unwrap();
        std::fs::write(root.join("checkpoints/snapshot.pt"), "ddp's").unwrap();
        f.after("ddp");
        f.finish(&mut notes);
        assert_eq!(std::fs::read_to_string(root.join("checkpoints/snapshot.pt")).unwrap(), "ddp's");
        let all = notes.join("\n");
        assert!(all.contains("accumulation leg's new files") && all.contains("checkpoints"), "{all}");
        assert!(all.contains("kept.txt was in the working folder before the check"), "{all}");
    }
}
