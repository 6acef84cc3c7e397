//! The torch releases the recorder is tested on: users' scripts run on their own torch, from
//! 2.4 up to the newest release CI runs (`python/requirements-current.txt`, `.venv-current`).
//! A trace from a newer torch is judged all the same, and its report says so: the recorder
//! patches torch's internals, and a part it cannot find there is a warning of its own.

/// The newest torch (major, minor) CI runs the recorder on.
pub const TORCH_TESTED_UP_TO: (u32, u32) = (2, 15);

/// `version`'s (major, minor), where it reads as torch writes it ("2.15.0+cu132", "2.16.0a0").
fn major_minor(version: &str) -> Option<(u32, u32)> {
    let mut parts = version.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor: String = parts.next()?.chars().take_while(char::is_ascii_digit).collect();
    Some((major, minor.parse().ok()?))
}

/// The words for a trace whose torch is newer than `TORCH_TESTED_UP_TO`, else None.
pub fn untested(version: &str) -> Option<String> {
    let seen = major_minor(version)?;
    (seen > TORCH_TESTED_UP_TO).then(|| {
        let (major, minor) = TORCH_TESTED_UP_TO;
        format!("recorder tested up to torch {major}.{minor}; this is {}.{}", seen.0, seen.1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_newer_release_is_said() {
        assert_eq!(untested("2.15.0+cu132"), None);
        assert_eq!(untested("2.4.1"), None);
        assert_eq!(untested("2.16.0a0+git1234").as_deref(), Some("recorder tested up to torch 2.15; this is 2.16"));
        assert_eq!(untested("3.0.0").as_deref(), Some("recorder tested up to torch 2.15; this is 3.0"));
        assert_eq!(untested("nonsense"), None);
    }

    /// The release CI installs is the one named here, and the wheel's requirement lets it in:
    /// no cap at or below it (a user's newer torch is never downgraded by `pip install`).
    #[test]
    fn ci_runs_this_release_and_the_wheel_allows_it_and_newer() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let current = std::fs::read_to_string(root.join("python/requirements-current.txt")).unwrap();
        let pin = current
            .lines()
            .find_map(|l| l.split('#').next().unwrap().trim().strip_prefix("torch=="))
            .expect("python/requirements-current.txt pins torch");
        assert_eq!(major_minor(pin), Some(TORCH_TESTED_UP_TO), "requirements-current.txt's torch {pin}");
        let pyproject = std::fs::read_to_string(root.join("python/pyproject.toml")).unwrap();
        let deps = pyproject.lines().find(|l| l.trim_start().starts_with("dependencies")).unwrap();
        let torch = deps.split('"').find(|d| d.starts_with("torch")).expect("the wheel requires torch");
        for cap in torch.split(',').filter_map(|c| c.trim().strip_prefix('<')) {
            let cap = cap.trim_start_matches('=');
            assert!(major_minor(cap).is_none_or(|c| c > TORCH_TESTED_UP_TO), "the wheel caps torch at <{cap}");
        }
    }
}
