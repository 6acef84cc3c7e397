//! Faults with real processes: a rank killed with SIGKILL, a rank that hangs, Ctrl-C, and
//! a run that blows up to Inf. Every rank must be gone afterwards.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::util::{ddp_verify, stdout};

/// Starts ddp-verify with rank 1 stalled (a test hook) and every rank's pid recorded.
fn start_stalled(pids: &Path, extra: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_ddp-verify"))
        .args(extra)
        .env("DDP_VERIFY_TEST_PID_DIR", pids)
        .env("DDP_VERIFY_TEST_STALL", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn rank_pids(dir: &Path) -> Vec<i32> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let pids: Vec<i32> = (0..2)
            .filter_map(|r| std::fs::read_to_string(dir.join(format!("rank{r}.pid"))).ok()?.parse().ok())
            .collect();
        if pids.len() == 2 {
            return pids;
        }
        assert!(Instant::now() < deadline, "ranks never started");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits for exit with a guard, returning (exit code, stderr, seconds taken).
fn finish(child: Child, started: Instant) -> (Option<i32>, String, f64) {
    let out = child.wait_with_output().unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned(), started.elapsed().as_secs_f64())
}

fn assert_all_gone(pids: &[i32]) {
    std::thread::sleep(Duration::from_millis(200));
    for pid in pids {
        let alive = std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "));
        assert!(!alive, "rank process {pid} was left behind");
    }
}

/// Both kinds of run: the linear model free-running (rank 0's accumulation thread beside its
/// DDP share) and a ResNet in lockstep (each DDP step restarts from the accumulation run).
const MODES: [&[&str]; 2] = [&[], &["--model", "resnet-tiny", "--data-size", "16"]];

#[test]
fn a_rank_killed_mid_run_stops_every_rank_and_exits_3_naming_it() {
    for mode in MODES {
        let dir = tempfile::tempdir().unwrap();
        let child = start_stalled(dir.path(), &[mode, &["--timeout", "120"][..]].concat());
        let pids = rank_pids(dir.path());
        let started = Instant::now();
        unsafe { libc::kill(pids[1], libc::SIGKILL) };
        let (code, err, secs) = finish(child, started);
        assert_eq!(code, Some(3), "{mode:?}: {err}");
        assert!(err.contains("rank 1") && err.contains("signal 9"), "{mode:?}: {err}");
        assert!(secs < 30.0, "took {secs} s");
        assert_all_gone(&pids);
    }
}

#[test]
fn a_hung_rank_is_stopped_at_the_timeout_with_exit_3() {
    for mode in MODES {
        let dir = tempfile::tempdir().unwrap();
        let started = Instant::now();
        let child = start_stalled(dir.path(), &[mode, &["--timeout", "3"][..]].concat());
        let pids = rank_pids(dir.path());
        let (code, err, secs) = finish(child, started);
        assert_eq!(code, Some(3), "{mode:?}: {err}");
        assert!(err.contains("--timeout 3"), "{mode:?}: {err}");
        assert!(secs < 20.0, "took {secs} s");
        assert_all_gone(&pids);
    }
}

#[test]
fn ctrl_c_stops_every_rank() {
    let dir = tempfile::tempdir().unwrap();
    let child = start_stalled(dir.path(), &["--timeout", "120"]);
    let pids = rank_pids(dir.path());
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let (code, err, _) = finish(child, Instant::now());
    assert_eq!(code, Some(130), "{err}");
    assert_all_gone(&pids);
}

#[test]
fn inf_in_the_weights_is_not_equivalent_even_when_both_runs_agree() {
    let out = ddp_verify(&["--lr", "1e38"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("first differ at final weights, linear.weight: non-finite"), "{text}");
}

/// A closed terminal, QUIT or TERM: exit 128 + the signal, and no rank left behind.
#[test]
fn hangup_quit_and_term_stop_every_rank() {
    for sig in [libc::SIGHUP, libc::SIGQUIT, libc::SIGTERM] {
        let dir = tempfile::tempdir().unwrap();
        let child = start_stalled(dir.path(), &["--timeout", "120"]);
        let pids = rank_pids(dir.path());
        unsafe { libc::kill(child.id() as i32, sig) };
        let (code, err, secs) = finish(child, Instant::now());
        assert_eq!(code, Some(128 + sig), "signal {sig}: {err}");
        assert!(secs < 15.0, "took {secs} s");
        assert_all_gone(&pids);
    }
}

/// No handler sees a KILL: the ranks notice that the process that started them is gone.
#[test]
fn killing_the_command_with_sigkill_leaves_no_rank_running() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = start_stalled(dir.path(), &["--timeout", "120"]);
    let pids = rank_pids(dir.path());
    child.kill().unwrap();
    let _ = child.wait();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline && pids.iter().any(|p| Path::new(&format!("/proc/{p}")).exists()) {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_all_gone(&pids);
}

/// explore starts its ranks once; Ctrl-C must stop them too (and exit 130).
#[test]
fn ctrl_c_stops_explore_and_its_ranks() {
    let dir = tempfile::tempdir().unwrap();
    let reg = dir.path().join("regressions.txt");
    let child = Command::new(env!("CARGO_BIN_EXE_ddp-verify"))
        .args(["explore", "--model", "linear", "--cases", "100000", "--max-gpus", "2", "--regressions"])
        .arg(&reg)
        .env("DDP_VERIFY_TEST_PID_DIR", dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pids = rank_pids(dir.path());
    std::thread::sleep(Duration::from_millis(500));
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let (code, err, secs) = finish(child, Instant::now());
    assert_eq!(code, Some(130), "{err}");
    assert!(secs < 15.0, "took {secs} s");
    assert_all_gone(&pids);
}

/// A rank that fails mid-run (rank 0 or another) stops every rank at once: exit 3 within
/// seconds naming it, not a wait for --timeout in a collective the failed rank never joins.
#[test]
fn a_rank_that_fails_stops_every_rank_at_once() {
    for mode in MODES {
        for rank in ["0", "1"] {
            let started = Instant::now();
            let out = Command::new(env!("CARGO_BIN_EXE_ddp-verify"))
                .args([mode, &["--timeout", "120"][..]].concat())
                .env("DDP_VERIFY_TEST_FAIL", rank)
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(3), "{mode:?} rank {rank}: {err}");
            assert!(err.starts_with(&format!("ddp-verify: rank {rank}: failing on purpose")), "{err}");
            // Well under the 120 s --timeout the ranks would otherwise wait, even on a loaded machine.
            assert!(started.elapsed() < Duration::from_secs(60), "took {:?}", started.elapsed());
        }
    }
}
