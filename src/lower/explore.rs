//! `explore`'s flags, for both subjects: a flag of the other subject's refused first, then
//! the flags they share checked once, by one rule each (`--cases`, `--max-gpus`,
//! `--regressions`, the tolerance, the seed), then each subject's own: our models' models and
//! bugs, a user's command, its placeholders and axes. Everything is checked before any rank
//! or case starts.

use ddp_verify_cli::values::Pick;
use ddp_verify_cli::{defaults, ExploreArgs};

use super::checked_overrides;
use crate::error::{Error, Result};
use crate::evidence::SAVED_FILES;
use crate::spec::{
    Axis, Bug, CompareOptions, Exploration, ExploreOptions, ModelKind, ScriptExplore, ScriptOptions, Takes,
    ToleranceOverrides,
};

/// What the shared flags' rules take from the subject.
struct Subject {
    /// `--cases` when it is not given: a case of a script runs it two or three times.
    cases: usize,
    /// The fewest ranks a case runs on, and why no fewer.
    min_gpus: usize,
    why: &'static str,
}

/// Our models: W=1 is a case too (DDP's one rank against accumulation).
const OUR_MODELS: Subject =
    Subject { cases: defaults::EXPLORE_CASES, min_gpus: 1, why: "a case needs a rank to run on" };
/// A user's script: W=1 is not, as for `-- COMMAND --gpus`.
const A_SCRIPT: Subject =
    Subject { cases: defaults::EXPLORE_SCRIPT_CASES, min_gpus: 2, why: "a DDP leg of one process proves nothing" };

/// The placeholders ddp-verify fills itself; `--axis` may not take these names.
const FILLED: [&str; 8] = ["acc_steps", "local_acc_steps", "gpus", "world", "batch", "leg", "data_size", "seed"];

/// `explore`'s flags for our own models: the models drawn and the bugs planted, each bug on
/// a model it applies to.
pub fn models(args: &ExploreArgs) -> Result<ExploreOptions> {
    let script_only = match () {
        _ if !args.axis.is_empty() => Some("--axis"),
        _ if args.max_time.is_some() => Some("--max-time"),
        _ if args.timeout != defaults::TIMEOUT_S => Some("--timeout"),
        _ => None,
    };
    if let Some(flag) = script_only {
        return Err(Error::bad_flag(
            flag,
            "is for exploring your own command",
            "give your training command after -- (explore ... -- python train.py ARGS), or drop it",
        ));
    }
    let (exploration, tolerance) = shared(args, OUR_MODELS)?;
    let bugs = match args.inject {
        None => vec![None],
        Some(Pick::All) => Bug::ALL.into_iter().map(Some).collect(),
        Some(Pick::One(bug)) => vec![Some(bug)],
    };
    let drawn = [ModelKind::Linear, ModelKind::ResnetTiny, ModelKind::TinyLm];
    let models = match args.model {
        Pick::All => drawn.to_vec(),
        Pick::One(m) if drawn.contains(&m) => vec![m],
        Pick::One(other) => {
            return Err(Error::bad_flag(
                "--model",
                format!("explore draws linear, resnet-tiny or tiny-lm configurations, not '{other}'"),
                "pass --model linear, resnet-tiny, tiny-lm or all",
            ))
        }
    };
    // `--inject all` passes over each bug on the models that can carry it; one named must fit.
    let named = args.inject != Some(Pick::All);
    if let Some(b) = bugs.iter().flatten().find(|b| named && !models.iter().any(|&m| b.applies_to(m))) {
        return Err(Error::bad_flag(
            "--inject",
            format!("{} applies to none of the models drawn ({})", b.name(), args.model),
            "pass --model tiny-lm for the token-count bugs, linear or resnet-tiny for no-loss-scale and double-scale",
        ));
    }
    Ok(ExploreOptions {
        exploration,
        models,
        bugs,
        tolerance,
        progress: ddp_verify_launch::progress_wanted(),
        kernels: args.kernels.kernels.unwrap_or_default(),
    })
}

/// `explore -- COMMAND`'s flags: the command as the zero-edit check reads it, for one
/// machine, taking K (else nothing explored would reach it), and each axis a placeholder of
/// its own that the command takes.
pub fn script(args: &ExploreArgs) -> Result<ScriptExplore> {
    if args.inject.is_some() {
        return Err(Error::bad_flag(
            "--inject",
            "plants bugs in ddp-verify's own models, not in your command",
            "drop --inject (or explore ddp-verify's own models without a command)",
        ));
    }
    let (exploration, tolerance) = shared(args, A_SCRIPT)?;
    let launcher = crate::jobs::launcher::parse(&args.script).map_err(|problem| {
        Error::bad_flag("--", problem, "give -- python train.py ARGS or -- torchrun [OPTIONS] train.py ARGS")
    })?;
    if launcher.nodes > 1 {
        return Err(Error::bad_flag(
            "--",
            format!("the command's DDP leg spans {} nodes; explore draws W on this machine", launcher.nodes),
            "explore with a one-node command, then check the nodes with ddp-verify -- COMMAND",
        ));
    }
    let takes_any = |p: &str| args.script.iter().any(|a| a.contains(p));
    if !takes_any("{acc_steps}") && !takes_any("{local_acc_steps}") {
        return Err(Error::bad_flag(
            "--",
            "the command takes neither {acc_steps} nor {local_acc_steps}: the K explore draws would not reach it",
            "pass K to your script with {acc_steps} (or {local_acc_steps}), e.g. --grad-accum {acc_steps}",
        ));
    }
    let axes = args.axis.iter().map(|a| axis(a, &takes_any)).collect::<Result<Vec<_>>>()?;
    if let Some(dup) = axes.iter().enumerate().find(|(i, a)| axes[..*i].iter().any(|b| b.name == a.name)) {
        return Err(Error::bad_flag("--axis", format!("{} is given twice", dup.1.name), "give each axis once"));
    }
    let script = ScriptOptions {
        launcher,
        acc_steps: 2,
        gpus: 2,
        batch_size: defaults::BATCH_SIZE,
        out: std::env::temp_dir(),
        timeout: args.timeout,
        sample: None,
        compare: CompareOptions {
            paths: [SAVED_FILES[0].into(), SAVED_FILES[1].into()],
            big: None,
            control: None,
            precision: None,
            precision_ddp: None,
            tolerance,
            reports: Vec::new(),
            plot: None,
            strict_buffers: false,
        },
        node_rank: 0,
        fills: Vec::new(),
        quiet: true,
        no_dropout: false,
        cpu: false,
        exit_grace: ddp_verify_cli::defaults::EXIT_GRACE_S,
    };
    Ok(ScriptExplore {
        exploration,
        script,
        command: args.script.clone(),
        max_time: args.max_time,
        takes: Takes { batch: takes_any("{batch}"), data_size: takes_any("{data_size}"), seed: takes_any("{seed}") },
        axes,
    })
}

/// The flags both subjects take, by one rule each: at least one case; at least the ranks
/// the subject's smallest case runs on; a regressions file that reads as one (both kinds of
/// line) and can be appended to; a tolerance that holds for every dtype; the seed, else a
/// fresh one (printed for replay).
fn shared(args: &ExploreArgs, subject: Subject) -> Result<(Exploration, ToleranceOverrides)> {
    let cases = args.cases.unwrap_or(subject.cases);
    if cases == 0 {
        return Err(Error::bad_flag("--cases", "must be at least 1", "pass --cases 1 or more"));
    }
    if args.max_gpus < subject.min_gpus {
        return Err(Error::bad_flag(
            "--max-gpus",
            format!("{}: {}", args.max_gpus, subject.why),
            format!("pass --max-gpus {} or more", subject.min_gpus),
        ));
    }
    // Read and writable before any case runs: a finding must not be lost at the end.
    crate::jobs::explore::check_regressions(&args.regressions)?;
    let tolerance = checked_overrides(&args.tolerance)?;
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos() as u64)
    });
    let (max_gpus, regressions, json) = (args.max_gpus, args.regressions.clone(), args.json);
    Ok((Exploration { cases, seed, max_gpus, regressions, json }, tolerance))
}

/// `--axis NAME=V1,V2,...`, its NAME a placeholder the command takes and none of ours.
fn axis(text: &str, takes: &dyn Fn(&str) -> bool) -> Result<Axis> {
    let fix = "give --axis NAME=V1,V2,... with {NAME} in your command";
    let Some((name, values)) = text.split_once('=') else {
        return Err(Error::bad_flag("--axis", format!("'{text}' has no '='"), fix));
    };
    let name = name.trim();
    let word = !name.is_empty()
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit());
    if !word {
        return Err(Error::bad_flag("--axis", format!("'{name}' is not a placeholder name"), fix));
    }
    if FILLED.contains(&name) {
        return Err(Error::bad_flag(
            "--axis",
            format!("{{{name}}} is one ddp-verify fills itself"),
            "name your axis otherwise",
        ));
    }
    if !takes(&format!("{{{name}}}")) {
        return Err(Error::bad_flag("--axis", format!("the command has no {{{name}}}"), fix));
    }
    let values: Vec<String> = values.split(',').map(|v| v.trim().to_string()).collect();
    if values.iter().any(String::is_empty) {
        return Err(Error::bad_flag("--axis", format!("{name} has an empty value in '{text}'"), fix));
    }
    Ok(Axis { name: name.to_string(), values })
}
