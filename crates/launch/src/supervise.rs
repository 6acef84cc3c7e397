//! Watching the mpirun of one DDP run: a deadline, the ranks' messages passed through with
//! Open MPI's banners read (which rank died, how) instead of shown, and a clean stop of
//! mpirun and every rank on timeout, failure or Ctrl-C.

use std::process::Child;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use crate::error::{LaunchError as Error, Result};

/// An mpirun and its ranks under way.
pub(crate) struct Supervised {
    child: Child,
    group: i32,
    /// A verification's deadline and --timeout; none for explore.
    deadline: Option<(Instant, Duration)>,
    watcher: Option<std::thread::JoinHandle<Option<RankDeath>>>,
}

impl Supervised {
    /// Takes over a started mpirun (spawned in a process group of its own; its stderr read
    /// for rank deaths when piped).
    pub(crate) fn new(mut child: Child, timeout: Option<Duration>) -> Self {
        let group = child.id() as i32;
        CHILD_GROUP.store(group, Ordering::SeqCst);
        install_interrupt_handler();
        let watcher = child.stderr.take().map(|stderr| std::thread::spawn(move || watch_stderr(stderr)));
        let deadline = timeout.map(|t| (Instant::now().checked_add(t).unwrap_or_else(far_future), t));
        Supervised { child, group, deadline, watcher }
    }

    /// Copies mpirun's piped standard output to ours on a thread; the first failed write is
    /// what the thread returns (it reads on to the end, so no rank blocks on a full pipe).
    pub(crate) fn forwarding_stdout(mut self) -> (Self, std::thread::JoinHandle<std::io::Result<()>>) {
        let from = self.child.stdout.take();
        let thread = std::thread::spawn(move || {
            use std::io::{Read, Write};
            let Some(mut from) = from else { return Ok(()) };
            let (mut buf, mut failed) = (vec![0u8; 1 << 16], None);
            let mut out = std::io::stdout();
            loop {
                let n = match from.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                if failed.is_none() {
                    if let Err(e) = out.write_all(&buf[..n]).and_then(|()| out.flush()) {
                        failed = Some(e);
                    }
                }
            }
            failed.map_or(Ok(()), Err)
        });
        (self, thread)
    }

    /// Waits until mpirun is done, stopping every rank on a timeout or a rank's death.
    pub(crate) fn finished(mut self) -> Result<()> {
        let status = self.exited("the DDP ranks")?;
        let death = self.watcher.take().and_then(|w| w.join().ok()).flatten();
        if !status.success() {
            return Err(match death {
                Some(d) => Error::Rank { rank: d.rank, problem: format!("{}; every rank was stopped", d.how) },
                None => Error::Launcher {
                    problem: format!("the DDP ranks failed (mpirun {status}); every rank was stopped"),
                    fix: "see the rank's message above".into(),
                },
            });
        }
        Ok(())
    }

    /// Waits until the command is done, stopping its whole group on a timeout or a signal;
    /// its exit status, whatever it is. `what` names it in the timeout's message.
    pub(crate) fn exited(&mut self, what: &str) -> Result<std::process::ExitStatus> {
        self.exited_ticking(what, &mut |_| {})
    }

    /// `exited`, calling `tick` with the time since it began about four times a second (a
    /// progress line).
    pub(crate) fn exited_ticking(
        &mut self,
        what: &str,
        tick: &mut dyn FnMut(Duration),
    ) -> Result<std::process::ExitStatus> {
        self.exited_until(what, tick, None).map(|(status, _)| status)
    }

    /// `exited_ticking`, and where `done` says the command's work is complete (its trace
    /// written), a command still running `grace` later is stopped: its status then, and
    /// the processes that lingered.
    pub(crate) fn exited_until(
        &mut self,
        what: &str,
        tick: &mut dyn FnMut(Duration),
        done: Option<(&dyn Fn() -> bool, Duration)>,
    ) -> Result<(std::process::ExitStatus, Option<Lingered>)> {
        let started = Instant::now();
        let mut next_tick = started;
        let mut done_at: Option<Instant> = None;
        let status = loop {
            if Instant::now() >= next_tick {
                tick(started.elapsed());
                next_tick += Duration::from_millis(250);
                if let (None, Some((is_done, _))) = (done_at, done) {
                    done_at = is_done().then(Instant::now);
                }
            }
            if let Some(status) = self.child.try_wait().map_err(|e| Error::io("waiting for mpirun", e))? {
                break status;
            }
            if let (Some(at), Some((_, grace))) = (done_at, done) {
                if at.elapsed() >= grace {
                    let processes = lingering(self.group, self.child.id() as i32);
                    stop_group(self.group, &mut self.child);
                    let status = self.child.wait().map_err(|e| Error::io("waiting for the command", e))?;
                    signal_group(self.group, libc::SIGKILL);
                    return Ok((status, Some(Lingered { after: grace, processes })));
                }
            }
            let signal = INTERRUPTED.load(Ordering::SeqCst);
            if signal != 0 {
                // The handler sent mpirun a TERM; give its teardown a moment, then make sure.
                stop_group(self.group, &mut self.child);
                return Err(Error::Interrupted { signal });
            }
            if let Some((_, timeout)) = self.deadline.filter(|(d, _)| Instant::now() >= *d) {
                stop_group(self.group, &mut self.child);
                return Err(Error::Launcher {
                    problem: format!(
                        "{what} did not finish within --timeout {} s (hung?); every process was stopped",
                        timeout.as_secs_f64()
                    ),
                    fix: "raise --timeout if the run is only slow".into(),
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        // It is gone; sweep anything it left in its group.
        signal_group(self.group, libc::SIGKILL);
        Ok((status, None))
    }
}

/// A command still running `after` its work was complete, stopped then.
#[derive(Debug, Clone)]
pub struct Lingered {
    pub after: Duration,
    /// The processes of its group still there, training ranks first.
    pub processes: Vec<Lingerer>,
}

/// One process that lingered: its rank (torchrun's RANK in its environment), and the
/// kernel's word for where it waited.
#[derive(Debug, Clone)]
pub struct Lingerer {
    pub pid: i32,
    pub rank: Option<usize>,
    pub name: String,
    pub waiting_in: Option<String>,
}

/// The processes of group `group` and the descendants of `root` (torchrun starts its workers
/// in sessions of their own), read from /proc: those with a RANK (the training's), else all
/// (a one-process leg).
fn lingering(group: i32, root: i32) -> Vec<Lingerer> {
    let table = processes();
    let mut ours: Vec<i32> = table.iter().filter(|p| p.2 == group || p.0 == root).map(|p| p.0).collect();
    let mut at = 0;
    while at < ours.len() {
        let parent = ours[at];
        ours.extend(table.iter().filter(|p| p.1 == parent && !ours.contains(&p.0)).map(|p| p.0).collect::<Vec<_>>());
        at += 1;
    }
    let mut all: Vec<Lingerer> = table
        .iter()
        .filter(|p| ours.contains(&p.0))
        .map(|(pid, _, _, name)| {
            let (pid, name) = (*pid, name.clone());
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            let rank = environ
                .split(|b| *b == 0)
                .find_map(|kv| std::str::from_utf8(kv.strip_prefix(b"RANK=")?).ok()?.parse().ok());
            let waiting_in = std::fs::read_to_string(format!("/proc/{pid}/wchan"))
                .ok()
                .map(|w| w.trim().to_string())
                .filter(|w| !w.is_empty() && w != "0");
            Lingerer { pid, rank, name, waiting_in }
        })
        .collect();
    if all.iter().any(|p| p.rank.is_some()) {
        all.retain(|p| p.rank.is_some());
    }
    all.sort_by_key(|p| (p.rank, p.pid));
    all
}

/// If the caller gives up (its own run failed), the ranks are stopped, not left behind.
impl Drop for Supervised {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            stop_group(self.group, &mut self.child);
        }
        signal_group(self.group, libc::SIGKILL);
        CHILD_GROUP.store(0, Ordering::SeqCst);
    }
}

/// What Open MPI said about a rank that died.
struct RankDeath {
    rank: usize,
    how: String,
}

/// Forwards the ranks' own messages and keeps Open MPI's banners out of the user's way,
/// reading from them which rank died and how.
fn watch_stderr(stderr: std::process::ChildStderr) -> Option<RankDeath> {
    use std::io::BufRead;
    let mut death = None;
    let mut in_banner = false;
    for line in std::io::BufReader::new(stderr).lines().map_while(std::result::Result::ok) {
        if line.starts_with("-----") {
            in_banner = !in_banner;
            continue;
        }
        if let Some(d) = parse_death(&line) {
            death.get_or_insert(d);
        } else if !in_banner && !line.trim().is_empty() && !line.contains("ORTE_ERROR_LOG") {
            // ORTE_ERROR_LOG lines are Open MPI's own bookkeeping while it tears a job down.
            eprintln!("{line}");
        }
    }
    death
}

/// "mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed)."
fn parse_death(line: &str) -> Option<RankDeath> {
    let rest = line.split("process rank ").nth(1)?;
    let rank = rest.split_whitespace().next()?.parse().ok()?;
    let how =
        rest.split(" exited ").nth(1).map_or("died".to_string(), |h| format!("exited {}", h.trim_end_matches('.')));
    Some(RankDeath { rank, how })
}

/// The process group of the mpirun under way, for the interrupt handler.
static CHILD_GROUP: AtomicI32 = AtomicI32::new(0);
/// The signal that asked us to stop, once one did (0 until then).
static INTERRUPTED: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_interrupt(sig: libc::c_int) {
    // Only async-signal-safe calls here: TERM mpirun, whose teardown stops the ranks, and
    // note the signal. The waiting loop then stops what is left, our temporary directory
    // (Open MPI's session files and shared memory) is removed on the way out, and the exit
    // code is 128 + the signal. A second signal while stopping exits at once.
    let group = CHILD_GROUP.load(Ordering::SeqCst);
    unsafe {
        if group > 0 {
            libc::kill(-group, libc::SIGTERM);
        }
        if INTERRUPTED.swap(sig, Ordering::SeqCst) != 0 || group <= 0 {
            if group > 0 {
                libc::kill(-group, libc::SIGKILL);
            }
            libc::_exit(128 + sig);
        }
    }
}

/// Ctrl-C, TERM, a closed terminal (HUP) or QUIT stops mpirun's whole group before we exit.
fn install_interrupt_handler() {
    let handler = on_interrupt as extern "C" fn(libc::c_int) as libc::sighandler_t;
    unsafe {
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
            libc::signal(sig, handler);
        }
    }
}

/// A deadline no run reaches (a --timeout too large for the clock).
fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(100 * 365 * 86_400)
}

fn signal_group(group: i32, sig: libc::c_int) {
    if group > 0 {
        unsafe { libc::kill(-group, sig) };
    }
}

/// TERM first so mpirun can tear its job down, KILL whatever is left after a grace period.
/// Open MPI puts each rank in a process group of its own, so the ranks (mpirun's children)
/// are listed first and killed one by one if mpirun did not stop them.
fn stop_group(group: i32, child: &mut Child) {
    let ranks = children_of(child.id() as i32);
    signal_group(group, libc::SIGTERM);
    let grace = Instant::now() + Duration::from_secs(3);
    while Instant::now() < grace {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    signal_group(group, libc::SIGKILL);
    for pid in ranks {
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let _ = child.wait();
}

/// Processes whose parent is `pid`, from /proc.
fn children_of(pid: i32) -> Vec<i32> {
    processes().into_iter().filter(|p| p.1 == pid).map(|p| p.0).collect()
}

/// (pid, parent, process group, comm) of every process, from /proc.
fn processes() -> Vec<(i32, i32, i32, String)> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // "P (comm) S PPID PGRP ...": the comm may hold spaces, so read after the last ')'.
            let (head, rest) = stat.rsplit_once(')')?;
            let mut f = rest.split_whitespace().skip(1);
            let (parent, pgrp) = (f.next()?.parse().ok()?, f.next()?.parse().ok()?);
            Some((pid, parent, pgrp, head.split_once('(').map_or("", |(_, n)| n).to_string()))
        })
        .collect()
}
