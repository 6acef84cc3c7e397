//! The exit codes, documented in `--help` and the README, as one type.

/// How a command ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// 0: the runs are equivalent (or the command did what was asked).
    Equivalent,
    /// 1: the runs are not equivalent.
    NotEquivalent,
    /// 2: bad usage or input, refused before anything ran.
    BadInput,
    /// 3: a rank or the launcher failed.
    Failed,
    /// 4: no verdict: this machine's kernels do not repeat themselves (the same micro-batch
    /// computed twice gave other bits), so no difference between the runs would mean anything.
    NoVerdict,
    /// 128 + the signal (130 for Ctrl-C), as a shell reports it; every rank was stopped.
    Interrupted { signal: i32 },
}

pub const EXIT_CODES: &str =
    "Exit codes: 0 equivalent, 1 not equivalent, 2 bad usage or input, 3 a rank or the launcher failed, \
     4 no verdict (this machine's kernels do not repeat themselves).";

impl Exit {
    pub fn code(self) -> u8 {
        match self {
            Exit::Equivalent => 0,
            Exit::NotEquivalent => 1,
            Exit::BadInput => 2,
            Exit::Failed => 3,
            Exit::NoVerdict => 4,
            Exit::Interrupted { signal } => u8::try_from(128 + signal).unwrap_or(130),
        }
    }

    /// The exit a process ended with by its code (rank 0's, read back by the launcher).
    pub fn from_code(code: u8) -> Exit {
        match code {
            0 => Exit::Equivalent,
            1 => Exit::NotEquivalent,
            2 => Exit::BadInput,
            4 => Exit::NoVerdict,
            129.. => Exit::Interrupted { signal: i32::from(code) - 128 },
            _ => Exit::Failed,
        }
    }
}

/// clap's refusal as one line, like every other bad input: its first paragraph, which
/// names the flag (both binaries print it, then exit 2).
pub fn usage_line(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let paragraph: Vec<&str> = text.lines().take_while(|l| !l.trim().is_empty()).map(str::trim).collect();
    format!("{} (see ddp-verify --help)", paragraph.join(" ").trim_start_matches("error: "))
}

#[cfg(test)]
mod tests {
    use super::Exit;

    #[test]
    fn codes_are_the_documented_ones() {
        let codes: Vec<u8> = [Exit::Equivalent, Exit::NotEquivalent, Exit::BadInput, Exit::Failed, Exit::NoVerdict]
            .into_iter()
            .map(Exit::code)
            .collect();
        assert_eq!(codes, [0, 1, 2, 3, 4]);
        assert_eq!(Exit::Interrupted { signal: 2 }.code(), 130);
        assert_eq!(Exit::Interrupted { signal: 15 }.code(), 143);
        for code in [0, 1, 2, 3, 4, 130, 143] {
            assert_eq!(Exit::from_code(code).code(), code);
        }
    }
}
