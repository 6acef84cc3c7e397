//! What `ddp-verify` decides before handing over to `ddp-verify-core`: whether the
//! command is a verification in lockstep, which runs entirely inside W MPI ranks, so it
//! can start them itself. Anything else, or anything it does not plainly recognise, goes
//! to the core, which parses it properly (and refuses bad input). A wrong guess here can
//! only cost time: rank 0 validates everything again, and a world of the wrong size is
//! refused there naming --gpus.

use std::ffi::OsString;
use std::time::Duration;

/// `--gpus` when not given (the core's flag uses this same constant).
pub const DEFAULT_GPUS: usize = 2;
/// `--timeout` in seconds when not given (the core's flag uses this same constant).
pub const DEFAULT_TIMEOUT_S: f64 = 600.0;
/// Models verified in lockstep unless `--free-running` (the core checks this list
/// against its own in a test).
pub const LOCKSTEP_MODELS: [&str; 2] = ["resnet18", "resnet-tiny"];

/// A verification the front starts itself.
#[derive(Debug, PartialEq)]
pub struct Lockstep {
    pub gpus: usize,
    pub timeout: Duration,
}

/// `Some` only for the main command (no subcommand, no --help or --version) in lockstep,
/// outside an MPI world, with every argument a `--flag` or `--flag value`.
pub fn lockstep_plan(args: &[OsString]) -> Option<Lockstep> {
    if crate::inside_mpi_world() {
        return None;
    }
    let args: Vec<&str> = args.iter().map(|a| a.to_str()).collect::<Option<_>>()?;
    let (mut gpus, mut timeout, mut model) = (None, None, None);
    let (mut lockstep, mut free_running) = (false, false);
    let mut i = 0;
    while i < args.len() {
        // A subcommand, a short flag or a stray value: the core decides.
        let flag = args[i].strip_prefix("--").filter(|f| !f.is_empty())?;
        let (name, inline) = match flag.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (flag, None),
        };
        // The next word is this flag's value when it is not itself a flag.
        let value = || inline.or_else(|| args.get(i + 1).copied().filter(|v| !v.starts_with("--")));
        let slot = match name {
            "help" | "version" => return None,
            "lockstep" => {
                lockstep = true;
                None
            }
            "free-running" => {
                free_running = true;
                None
            }
            "gpus" => Some(&mut gpus),
            "timeout" => Some(&mut timeout),
            "model" => Some(&mut model),
            _ => None,
        };
        let v = value();
        if let Some(slot) = slot {
            // Given twice, or without a value: the core says what is wrong.
            if slot.is_some() || v.is_none() {
                return None;
            }
            *slot = v;
        }
        i += 1 + usize::from(v.is_some() && inline.is_none());
    }
    let resnet = model.is_some_and(|m| LOCKSTEP_MODELS.contains(&m));
    if free_running || !(lockstep || resnet) {
        return None;
    }
    let gpus = match gpus {
        Some(g) => g.parse().ok().filter(|&g| g > 0)?,
        None => DEFAULT_GPUS,
    };
    let timeout = match timeout {
        Some(t) => t.parse::<f64>().ok().filter(|t| t.is_finite() && *t > 0.0)?,
        None => DEFAULT_TIMEOUT_S,
    };
    Some(Lockstep { gpus, timeout: Duration::from_secs_f64(timeout) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(line: &str) -> Option<Lockstep> {
        lockstep_plan(&line.split_whitespace().map(OsString::from).collect::<Vec<_>>())
    }

    fn lockstep(gpus: usize, timeout: f64) -> Option<Lockstep> {
        Some(Lockstep { gpus, timeout: Duration::from_secs_f64(timeout) })
    }

    #[test]
    fn resnets_and_lockstep_are_started_here_with_their_gpus_and_timeout() {
        assert_eq!(plan("--model resnet18 --acc-steps 2 --max-steps 3"), lockstep(2, 600.0));
        assert_eq!(plan("--model=resnet-tiny --gpus=3 --timeout 20"), lockstep(3, 20.0));
        assert_eq!(plan("--shuffle --gpus 4 --lockstep --acc-steps 4"), lockstep(4, 600.0));
        assert_eq!(plan("--model resnet18 --bless --golden g --lr 0.1"), lockstep(2, 600.0));
    }

    #[test]
    fn everything_else_goes_to_the_core() {
        for line in [
            "",
            "--acc-steps 2 --gpus 2",
            "--model linear --gpus 2",
            "--model resnet18 --free-running",
            "explore --cases 10",
            "split --model resnet18",
            "--model resnet18 --help",
            "-h",
            "--model resnet18 --gpus 0",
            "--model resnet18 --gpus two",
            "--model resnet18 --gpus 2 --gpus 3",
            "--model resnet18 --gpus",
            "--model resnet18 --timeout -1",
            "--model resnet18 stray",
        ] {
            assert_eq!(plan(line), None, "{line}");
        }
    }
}
