//! What the optimizer step does (`--optimizer`, `--lr-schedule`): once per step in every run.

values! {
    /// `--optimizer`.
    #[derive(Default)]
    pub enum Optimizer {
        /// torch.optim.SGD with momentum and weight decay (libtorch's own C++ SGD): --momentum, --weight-decay
        #[default]
        Sgd = "sgd",
        /// torch.optim.AdamW(foreach=False), its arithmetic op for op: --betas, --eps, --weight-decay
        AdamW = "adamw",
    }
}

/// The learning rate of optimizer step s is lr · f(s), ticking once per optimizer step
/// (`LambdaLR(opt, f)`, `scheduler.step()` after `optimizer.step()`). `--lr-schedule`
/// takes `constant`, `warmup:N` or `cosine:N`.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Schedule {
    /// f(s) = 1.
    #[default]
    Constant,
    /// f(s) = min(1, (s + 1) / N).
    Warmup(usize),
    /// f(s) = (1 + cos(π · min(s, N) / N)) / 2.
    Cosine(usize),
}

impl Schedule {
    /// f(tick), in float64 as Python computes it.
    pub fn factor(self, tick: usize) -> f64 {
        match self {
            Schedule::Constant => 1.0,
            Schedule::Warmup(n) => (1.0f64).min((tick + 1) as f64 / n as f64),
            Schedule::Cosine(n) => 0.5 * (1.0 + (std::f64::consts::PI * tick.min(n) as f64 / n as f64).cos()),
        }
    }

    /// `constant`, `warmup:N` or `cosine:N` (N >= 1); None for anything else.
    pub fn parse(s: &str) -> Option<Self> {
        let steps = |n: &str| n.parse::<usize>().ok().filter(|&n| n >= 1);
        match s.split_once(':') {
            None if s == "constant" => Some(Schedule::Constant),
            Some(("warmup", n)) => steps(n).map(Schedule::Warmup),
            Some(("cosine", n)) => steps(n).map(Schedule::Cosine),
            _ => None,
        }
    }
}

impl std::fmt::Display for Schedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Schedule::Constant => write!(f, "constant"),
            Schedule::Warmup(n) => write!(f, "warmup:{n}"),
            Schedule::Cosine(n) => write!(f, "cosine:{n}"),
        }
    }
}

/// `--lr-schedule`'s parser, and serde's: one message for a schedule that is not one.
impl std::str::FromStr for Schedule {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Schedule::parse(s)
            .ok_or_else(|| format!("unknown lr schedule '{s}'; known: constant, warmup:N, cosine:N with N >= 1"))
    }
}

impl TryFrom<String> for Schedule {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl From<Schedule> for String {
    fn from(s: Schedule) -> String {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_parse_print_and_tick_as_lambda_lr_would() {
        for s in ["constant", "warmup:3", "cosine:4"] {
            assert_eq!(Schedule::parse(s).map(|s| s.to_string()).as_deref(), Some(s));
        }
        for bad in ["warmup", "warmup:0", "cosine:x", "linear:3", ""] {
            assert_eq!(Schedule::parse(bad), None, "{bad}");
        }
        let warm: Vec<f64> = (0..4).map(|s| Schedule::Warmup(3).factor(s)).collect();
        assert_eq!(warm, [1.0 / 3.0, 2.0 / 3.0, 1.0, 1.0]);
        assert_eq!(Schedule::Cosine(4).factor(0), 1.0);
        assert_eq!(Schedule::Cosine(4).factor(4), 0.0);
        assert_eq!(Schedule::Cosine(4).factor(9), 0.0);
    }
}
