//! What `ddp-verify` decides before handing over to `ddp-verify-core`: whether the
//! command is a verification, which runs entirely inside W MPI ranks, so it can start
//! them itself. Anything else (a subcommand, --help), or anything it does not plainly
//! recognise, goes to the core, which parses it properly. Rank 0 validates every flag
//! as the core would, so a wrong guess here costs only time: bad input is still one line
//! and exit 2, and a world of the wrong size is refused there naming --gpus.

use std::ffi::OsString;
use std::time::Duration;

/// `--gpus` when not given (the core's flag uses this same constant).
pub const DEFAULT_GPUS: usize = 2;
/// `--timeout` in seconds when not given (the core's flag uses this same constant).
pub const DEFAULT_TIMEOUT_S: f64 = 600.0;
/// Above this many ranks the core validates everything before any rank starts: a bad flag
/// should not first cost W processes of about 110 MiB each.
pub const VALIDATE_FIRST_ABOVE: usize = 4;
/// A verification the front starts itself.
#[derive(Debug, PartialEq)]
pub struct Plan {
    pub gpus: usize,
    pub timeout: Duration,
}

/// `Some` only for the main command (no subcommand, no --help or --version) outside an
/// MPI world, with every argument a `--flag` or `--flag value`.
pub fn plan(args: &[OsString]) -> Option<Plan> {
    if crate::inside_mpi_world() {
        return None;
    }
    let args: Vec<&str> = args.iter().map(|a| a.to_str()).collect::<Option<_>>()?;
    let (mut gpus, mut timeout) = (None, None);
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
            "gpus" => Some(&mut gpus),
            "timeout" => Some(&mut timeout),
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
    let gpus = match gpus {
        Some(g) => g.parse().ok().filter(|&g| g > 0)?,
        None => DEFAULT_GPUS,
    };
    let timeout = match timeout {
        Some(t) => t.parse::<f64>().ok().filter(|t| t.is_finite() && *t > 0.0)?,
        None => DEFAULT_TIMEOUT_S,
    };
    // A timeout beyond what a Duration holds (1e20 s) is as good as none.
    Some(Plan { gpus, timeout: Duration::try_from_secs_f64(timeout).unwrap_or(Duration::MAX) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan_of(line: &str) -> Option<Plan> {
        plan(&line.split_whitespace().map(OsString::from).collect::<Vec<_>>())
    }

    fn ranks(gpus: usize, timeout: f64) -> Option<Plan> {
        // A timeout beyond what a Duration holds (1e20 s) is as good as none.
        Some(Plan { gpus, timeout: Duration::try_from_secs_f64(timeout).unwrap_or(Duration::MAX) })
    }

    #[test]
    fn verifications_are_started_here_with_their_gpus_and_timeout() {
        assert_eq!(plan_of(""), ranks(2, 600.0));
        assert_eq!(plan_of("--acc-steps 2 --gpus 2"), ranks(2, 600.0));
        assert_eq!(plan_of("--model=resnet-tiny --gpus=3 --timeout 20"), ranks(3, 20.0));
        assert_eq!(plan_of("--shuffle --gpus 4 --lockstep --acc-steps 4"), ranks(4, 600.0));
        assert_eq!(plan_of("--model resnet18 --bless --golden g --lr 0.1"), ranks(2, 600.0));
    }

    #[test]
    fn everything_else_goes_to_the_core() {
        for line in [
            "explore --cases 10",
            "split --gpus 3",
            "devices",
            "--model resnet18 --help",
            "--version",
            "-h",
            "--gpus 0",
            "--gpus two",
            "--gpus 2 --gpus 3",
            "--acc-steps 2 --gpus",
            "--timeout -1",
            "--model resnet18 stray",
        ] {
            assert_eq!(plan_of(line), None, "{line}");
        }
    }
}
