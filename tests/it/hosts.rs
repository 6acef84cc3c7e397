//! Several hosts, on one machine: `tests/hosts/two_hosts.sh` makes two network namespaces,
//! each with a hostname of its own, joined by a veth pair, and starts the ranks across them
//! with Open MPI's own launcher (`mpirun --host A:n,B:n`, its daemon on B started by
//! `tests/hosts/netns-agent.sh` instead of ssh), the ranks talking over TCP on the veth.
//! Every case must give exit 0, the same verdict line and byte-identical `--save-trace`
//! files as the same run on one host. Needs root and `ip netns`: ignored by a plain `cargo
//! test` (its reason in the output), run by `scripts/test.sh` where it is root (`--ignored
//! hosts::`), and failing, with the script's reason, where the machine cannot run it.

use std::path::Path;
use std::process::Command;

use crate::util::{repo, stderr, stdout};

/// The script's cases: W=2 (one rank per host) and W=4 (two per host).
const CASES: [&str; 4] = ["linear-w2", "linear-w4", "resnet-tiny-w4", "tiny-lm-w4"];
/// The script's exit code when this machine cannot run it (automake's "skipped").
const SKIPPED: i32 = 77;

#[test]
#[ignore = "needs root and ip netns: scripts/test.sh runs it where root (cargo test --test integration -- --ignored hosts::)"]
fn ranks_on_two_hosts_give_the_verdict_and_traces_of_one_host_bit_for_bit() {
    // SAFETY: a plain syscall.
    assert_eq!(unsafe { libc::geteuid() }, 0, "not root: ip netns and unshare need root");
    let out = tempfile::tempdir().unwrap();
    let run = Command::new(repo("tests/hosts/two_hosts.sh"))
        .arg("--bin")
        .arg(env!("CARGO_BIN_EXE_ddp-verify"))
        .arg("--out")
        .arg(out.path())
        .args(CASES)
        .output()
        .expect("tests/hosts/two_hosts.sh runs");
    let text = stdout(&run);
    if run.status.code() == Some(SKIPPED) {
        let why = text.lines().find_map(|l| l.strip_prefix("two_hosts: skipped: ")).unwrap_or("(no reason given)");
        panic!("this machine cannot run two hosts: {why}");
    }
    assert!(run.status.success(), "two_hosts.sh failed ({}):\n{text}{}", run.status, stderr(&run));

    // The script's own verdict, checked again from the runs it kept.
    for case in CASES {
        let dir = out.path().join(case);
        let read = |p: &str| std::fs::read(dir.join(p)).unwrap_or_else(|e| panic!("{case}: reading {p}: {e}"));
        for side in ["one", "two"] {
            let rc = String::from_utf8_lossy(&read(&format!("{side}/rc"))).trim().to_string();
            assert_eq!(rc, "0", "{case}: the {side}-host run exited {rc}:\n{}", read_lossy(&dir, side, "stderr"));
        }
        let one = verdict(&read_lossy(&dir, "one", "stdout"));
        let two = verdict(&read_lossy(&dir, "two", "stdout"));
        assert!(one.starts_with("EQUIVALENT:"), "{case}: one host's verdict: {one:?}");
        assert_eq!(one, two, "{case}: one host and two hosts give different verdicts");
        // Open MPI's job map (--display-map): the ranks ran on both hosts.
        let map = read_lossy(&dir, "two", "stdout");
        let mut nodes: Vec<&str> =
            map.lines().filter_map(|l| l.trim().strip_prefix("Data for node: ")?.split_whitespace().next()).collect();
        nodes.sort_unstable();
        nodes.dedup();
        assert!(nodes.len() == 2 && nodes[0].ends_with("-a") && nodes[1].ends_with("-b"), "{case}: ranks on {nodes:?}");
        for file in ["accumulation.safetensors", "ddp.safetensors", "report.json"] {
            let (a, b) = (read(&format!("one/trace/{file}")), read(&format!("two/trace/{file}")));
            assert!(!a.is_empty() && a == b, "{case}: {file} differs between one host and two hosts");
        }
    }
    println!("{text}");
}

fn read_lossy(dir: &Path, side: &str, file: &str) -> String {
    String::from_utf8_lossy(&std::fs::read(dir.join(side).join(file)).unwrap_or_default()).into_owned()
}

/// The report's verdict: its last line that starts with one in capitals (EQUIVALENT: ...).
fn verdict(report: &str) -> String {
    let starts_verdict = |l: &&str| {
        l.split_once(':').is_some_and(|(w, _)| !w.is_empty() && w.chars().all(|c| c.is_ascii_uppercase() || c == ' '))
    };
    report.lines().rfind(starts_verdict).unwrap_or("").to_string()
}
