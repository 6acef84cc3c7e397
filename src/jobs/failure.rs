//! What a failed leg's log says went wrong, in one line: the exception that ended the rank
//! torchrun names as the root cause (each rank's lines prefixed "[rankN]: "), or the last
//! exception of a plain process; the log's last line where neither is found. torchrun's own
//! summary ("ChildFailedError", a banner of "=" ending the log) is never the quote.

/// Longest quote kept: an exception's message can hold a whole tensor.
const MOST: usize = 300;

/// "rank 1 raised RuntimeError: ...", "RuntimeError: ...", or the last non-empty line.
pub fn quote(log: &str) -> String {
    let root = root_cause_rank(log);
    let found = match root {
        Some(r) => {
            let prefix = format!("[rank{r}]:");
            let mine: Vec<&str> = log
                .lines()
                .filter_map(|l| l.strip_prefix(prefix.as_str()))
                .map(|l| l.strip_prefix(' ').unwrap_or(l))
                .collect();
            last_exception(&mine).map(|e| format!("rank {r} raised {e}")).or_else(|| root_cause_end(log, r))
        }
        None => None,
    };
    let found = found.or_else(|| {
        let plain: Vec<&str> = log.lines().filter(|l| !l.starts_with("[rank")).collect();
        last_exception(&plain).filter(|e| !e.contains("ChildFailedError"))
    });
    let rule = |l: &str| l.trim().chars().all(|c| c == '=' || c == '-');
    let line = found.unwrap_or_else(|| log.lines().rev().find(|l| !rule(l)).unwrap_or("no output").trim().to_string());
    cut(&line)
}

/// The rank in torchrun's "Root Cause (first observed failure):" section.
fn root_cause_rank(log: &str) -> Option<usize> {
    let after = log.split("Root Cause (first observed failure)").nth(1)?;
    let line = after.lines().find(|l| l.trim_start().starts_with("rank "))?;
    line.split(':').nth(1)?.split_whitespace().next()?.parse().ok()
}

/// How the root cause's rank ended where it raised nothing (killed by a signal): torchrun's
/// own words for it, else its exit code.
fn root_cause_end(log: &str, rank: usize) -> Option<String> {
    let after = log.split("Root Cause (first observed failure)").nth(1)?;
    let field = |name: &str| {
        after.lines().find_map(|l| Some(l.trim_start().strip_prefix(name)?.trim_start().strip_prefix(':')?.trim()))
    };
    match field("traceback").filter(|t| !t.starts_with("To enable traceback")) {
        Some(t) => Some(format!("rank {rank}: {t}")),
        None => field("exitcode").map(|c| format!("rank {rank} exited with code {c}")),
    }
}

/// The exception line of the last traceback in `lines`: the first unindented line after its
/// frames.
fn last_exception(lines: &[&str]) -> Option<String> {
    let start = lines.iter().rposition(|l| l.starts_with("Traceback (most recent call last):"))?;
    lines[start + 1..]
        .iter()
        .find(|l| !l.is_empty() && !l.starts_with(char::is_whitespace))
        .map(|l| l.trim().to_string())
}

fn cut(line: &str) -> String {
    match line.char_indices().nth(MOST) {
        Some((at, _)) => format!("{}...", &line[..at]),
        None => line.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// torchrun 2.13's log of two gloo ranks, rank 1 raising (abridged, as printed).
    const TORCHRUN: &str = "\
W1127 03:50:56.630000 14576 torch/distributed/run.py:874] *****************************************
[rank1]: Traceback (most recent call last):
[rank1]:   File \"/tmp/fail/train.py\", line 5, in <module>
[rank1]:     raise RuntimeError(\"Cannot use ReduceOp.PREMUL_SUM with Gloo\")
[rank1]: RuntimeError: Cannot use ReduceOp.PREMUL_SUM with Gloo
[rank0]: Traceback (most recent call last):
[rank0]:   File \"/tmp/fail/train.py\", line 6, in <module>
[rank0]:     work.wait()
[rank0]: RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer
E1127 03:51:00.696000 14576 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 1
Traceback (most recent call last):
  File \"/work/main/.venv/bin/torchrun\", line 8, in <module>
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 14584)  (SIGTERM)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 14585) 
============================================================";

    #[test]
    fn the_root_cause_ranks_exception_is_quoted_not_torchruns_banner() {
        assert_eq!(quote(TORCHRUN), "rank 1 raised RuntimeError: Cannot use ReduceOp.PREMUL_SUM with Gloo");
    }

    #[test]
    fn a_rank_killed_by_a_signal_is_named_with_torchruns_words() {
        let silent: Vec<&str> = TORCHRUN.lines().filter(|l| !l.starts_with("[rank1]")).collect();
        let silent = silent.join("\n");
        assert_eq!(quote(&silent), "rank 1 exited with code 1 (pid: 14585)");
        let signal = "  exitcode  : -9 (pid: 14585)\n  traceback : Signal 9 (SIGKILL) received by PID 14585";
        let killed = silent.replace("  exitcode  : 1 (pid: 14585) ", signal);
        assert_eq!(quote(&killed), "rank 1: Signal 9 (SIGKILL) received by PID 14585");
    }

    #[test]
    fn a_plain_process_gives_its_last_exception_and_anything_else_its_last_line() {
        let plain = "step 0\nTraceback (most recent call last):\n  File \"t.py\", line 3\nValueError: no data\n";
        assert_eq!(quote(plain), "ValueError: no data");
        assert_eq!(quote("Killed\n\n"), "Killed");
        assert_eq!(quote("boom\n=====\n"), "boom");
        assert_eq!(quote(""), "no output");
        assert!(quote(&format!("E: {}", "x".repeat(1000))).ends_with("x..."));
    }
}
