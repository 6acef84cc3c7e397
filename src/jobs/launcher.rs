//! The command after `--`: plain Python, torchrun or `accelerate launch`. A launcher's own
//! options (mixed precision, config file, threads) stay as the user wrote them: they are part
//! of the training being checked. ddp-verify sets only the number of processes per leg.

use std::path::Path;

use crate::spec::{Launcher, LauncherKind};

/// torchrun's options that give the process count (underscore and dash spellings).
const TORCHRUN_COUNT: [&str; 2] = ["--nproc_per_node", "--nproc-per-node"];
/// torchrun's options that place one node among several: the accumulation and big-batch
/// legs run on one machine without them (each takes a value).
const TORCHRUN_NODES: [&str; 15] = [
    "--nnodes",
    "--node_rank",
    "--node-rank",
    "--rdzv_endpoint",
    "--rdzv-endpoint",
    "--rdzv_backend",
    "--rdzv-backend",
    "--rdzv_id",
    "--rdzv-id",
    "--rdzv_conf",
    "--rdzv-conf",
    "--master_addr",
    "--master-addr",
    "--master_port",
    "--master-port",
];
/// accelerate launch's.
const ACCELERATE_COUNT: [&str; 2] = ["--num_processes", "--num-processes"];
/// accelerate launch's flags that pick the kind of launch: ddp-verify picks it per leg.
/// `--cpu` goes too in the DDP leg: accelerate refuses it beside `--multi_gpu`, which on a
/// machine without GPUs launches W CPU processes.
const ACCELERATE_KIND: [&str; 3] = ["--multi_gpu", "--multi-gpu", "--cpu"];

/// Reads the command, or says in one line why it cannot run it as the legs.
pub fn parse(cmd: &[String]) -> Result<Launcher, String> {
    let name =
        |i: usize| cmd.get(i).map(|w| Path::new(w).file_name().map_or(w.clone(), |f| f.to_string_lossy().into()));
    let shown = cmd.join(" ");
    let prog = name(0).unwrap_or_default();
    let word = |i: usize| cmd.get(i).map(String::as_str);
    let (kind, head) = if prog.starts_with("python") {
        match (word(1), word(2)) {
            (Some("-m"), Some("torch.distributed.run")) => (LauncherKind::Torchrun, 3),
            (Some("-m"), Some("accelerate.commands.launch")) => (LauncherKind::Accelerate, 3),
            _ => (LauncherKind::Python, 1),
        }
    } else if prog == "torchrun" {
        (LauncherKind::Torchrun, 1)
    } else if prog == "accelerate" && word(1) == Some("launch") {
        (LauncherKind::Accelerate, 2)
    } else if prog == "accelerate-launch" {
        (LauncherKind::Accelerate, 1)
    } else {
        return Err(format!(
            "`{shown}` is not a Python command, torchrun or accelerate launch; the legs run the script through one"
        ));
    };
    let rest = &cmd[head..];
    let at = if kind == LauncherKind::Python {
        Some(0).filter(|_| !rest.is_empty())
    } else {
        // The launcher's options end at the script: a path ending in .py, or `-m module`.
        let module = |w: &String| matches!(w.as_str(), "-m" | "--module");
        rest.iter().position(|w| w.ends_with(".py") || module(w))
    };
    let Some(at) = at else {
        return Err(format!("no script in `{shown}`: give the training script as a path ending in .py"));
    };
    let options = rest[..at].to_vec();
    let value = |names: &[&str]| {
        options.iter().enumerate().find_map(|(i, w)| {
            names.iter().find_map(|n| {
                w.strip_prefix(&format!("{n}="))
                    .map(str::to_string)
                    .or_else(|| (w == n).then(|| options.get(i + 1).cloned().unwrap_or_default()))
            })
        })
    };
    if let Some(n) =
        value(&["--num_machines", "--num-machines"]).filter(|n| n != "1" && kind == LauncherKind::Accelerate)
    {
        return Err(format!(
            "`{shown}` launches on {n} machines; across machines ddp-verify runs torchrun's DDP leg \
             (-- torchrun --nnodes {n} ...), give one machine here"
        ));
    }
    let (nodes, node_rank) = match kind {
        LauncherKind::Torchrun => {
            (nodes(value(&["--nnodes"]), &shown)?, node_rank(value(&["--node_rank", "--node-rank"]), &shown)?)
        }
        _ => (1, None),
    };
    Ok(Launcher {
        kind,
        head: cmd[..head].to_vec(),
        options,
        script: rest[at..].to_vec(),
        python: python_of(&cmd[0]),
        nodes,
        node_rank,
    })
}

/// torchrun's `--nnodes`: N, or N:N (an elastic range of several sizes has no one DDP world
/// to compare with).
fn nodes(value: Option<String>, shown: &str) -> Result<usize, String> {
    let Some(v) = value else { return Ok(1) };
    let (lo, hi) = v.split_once(':').unwrap_or((&v, &v));
    match (lo.parse::<usize>(), hi.parse::<usize>()) {
        (Ok(lo), Ok(hi)) if lo == hi && lo > 0 => Ok(lo),
        _ => Err(format!("`{shown}`: --nnodes {v} is not one number of nodes; give --nnodes N (or N:N)")),
    }
}

fn node_rank(value: Option<String>, shown: &str) -> Result<Option<usize>, String> {
    value.map(|v| v.parse().map_err(|_| format!("`{shown}`: --node-rank {v} is not a whole number"))).transpose()
}

/// The Python a launcher runs the script with: the one beside it (a virtualenv's bin/),
/// else `python3` as the launcher's own shebang would find it.
pub fn python_of(program: &str) -> String {
    if Path::new(program).file_name().is_some_and(|f| f.to_string_lossy().starts_with("python")) {
        return program.to_string();
    }
    let found = if program.contains('/') {
        Some(Path::new(program).to_path_buf())
    } else {
        std::env::var_os("PATH").and_then(|p| std::env::split_paths(&p).map(|d| d.join(program)).find(|f| f.is_file()))
    };
    let beside = found.and_then(|f| {
        let dir = f.parent()?.to_path_buf();
        ["python", "python3"].iter().map(|n| dir.join(n)).find(|p| p.is_file())
    });
    beside.map_or_else(|| "python3".to_string(), |p| p.display().to_string())
}

/// The command for a leg of `world` processes, placeholders not yet filled in.
pub fn argv(l: &Launcher, world: usize) -> Vec<String> {
    let mut out = l.head.clone();
    match l.kind {
        LauncherKind::Python if world > 1 => {
            let launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node"];
            out.extend(launcher.iter().map(|s| s.to_string()).chain([world.to_string()]));
        }
        LauncherKind::Python => {}
        // The DDP leg across nodes: the user's rendezvous, W/nodes processes on each.
        LauncherKind::Torchrun if l.nodes > 1 && world > 1 => {
            out.extend(without(&l.options, &TORCHRUN_COUNT, &[]));
            out.extend([TORCHRUN_COUNT[0].to_string(), (world / l.nodes).to_string()]);
        }
        LauncherKind::Torchrun => {
            // A one-process leg of a command for several nodes runs on this machine alone.
            let options = match l.nodes > 1 {
                true => without(&l.options, &TORCHRUN_NODES, &["--standalone"]),
                false => l.options.clone(),
            };
            out.extend(without(&options, &TORCHRUN_COUNT, &[]));
            // One node: without a rendezvous of the user's, torchrun's own on a free port,
            // so that legs of several checks at once do not meet.
            let rendezvous = ["--standalone", "--rdzv", "--master"];
            if !options.iter().any(|o| rendezvous.iter().any(|r| o.starts_with(r))) {
                out.push("--standalone".into());
            }
            out.extend([TORCHRUN_COUNT[0].to_string(), world.to_string()]);
        }
        LauncherKind::Accelerate => {
            let kind_flags: &[&str] = if world > 1 { &ACCELERATE_KIND } else { &ACCELERATE_KIND[..2] };
            out.extend(without(&l.options, &ACCELERATE_COUNT, kind_flags));
            if world > 1 {
                out.push(ACCELERATE_KIND[0].into());
            }
            out.extend([ACCELERATE_COUNT[0].to_string(), world.to_string()]);
        }
    }
    out.extend(l.script.iter().cloned());
    out
}

/// The options without those taking a value in `valued` (either `--x N` or `--x=N`) and
/// without the bare `flags`.
fn without(options: &[String], valued: &[&str], flags: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    let mut skip = false;
    for o in options {
        if std::mem::take(&mut skip) {
            continue;
        }
        if valued.contains(&o.as_str()) {
            skip = true;
        } else if !valued.iter().any(|v| o.starts_with(&format!("{v}="))) && !flags.contains(&o.as_str()) {
            out.push(o.clone());
        }
    }
    out
}

/// The words with each `{name}` of `fills` put in (by name, without braces).
pub fn filled(words: &[String], fills: &[(String, String)]) -> Vec<String> {
    let fill = |a: &String| fills.iter().fold(a.clone(), |a, (k, v)| a.replace(&format!("{{{k}}}"), v));
    words.iter().map(fill).collect()
}

/// Words as one POSIX shell line: the command that reruns a case.
pub fn shell_words(words: &[String]) -> String {
    words.iter().map(|a| quote(a)).collect::<Vec<_>>().join(" ")
}

/// A word as a POSIX shell reads it back.
fn quote(a: &str) -> String {
    let plain = !a.is_empty() && a.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%{}".contains(c));
    match plain {
        true => a.to_string(),
        false => format!("'{}'", a.replace('\'', r"'\''")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    fn legs(cmd: &str) -> (String, String) {
        let l = parse(&words(cmd)).unwrap();
        (argv(&l, 1).join(" "), argv(&l, 2).join(" "))
    }

    #[test]
    fn python_runs_as_is_and_under_torchrun_for_ddp() {
        let (one, two) = legs("/v/bin/python train.py --k {acc_steps}");
        assert_eq!(one, "/v/bin/python train.py --k {acc_steps}");
        assert_eq!(
            two,
            "/v/bin/python -m torch.distributed.run --standalone --nproc_per_node 2 train.py --k {acc_steps}"
        );
        assert_eq!(parse(&words("/v/bin/python -m pkg.train")).unwrap().python, "/v/bin/python");
    }

    #[test]
    fn torchrun_keeps_the_users_options_and_sets_the_process_count_once() {
        let (one, two) = legs("torchrun --nproc_per_node=8 --max-restarts 0 train.py --nproc_per_node 3");
        assert_eq!(one, "torchrun --max-restarts 0 --standalone --nproc_per_node 1 train.py --nproc_per_node 3");
        assert_eq!(two, "torchrun --max-restarts 0 --standalone --nproc_per_node 2 train.py --nproc_per_node 3");
        let (_, two) = legs("python3 -m torch.distributed.run --master-port 2950 --nproc-per-node 4 -m pkg.train x");
        assert_eq!(two, "python3 -m torch.distributed.run --master-port 2950 --nproc_per_node 2 -m pkg.train x");
    }

    #[test]
    fn accelerate_launch_keeps_its_options_and_picks_the_launch_per_leg() {
        let (one, two) = legs("accelerate launch --cpu --mixed_precision bf16 --num_processes 4 train.py --lr 1");
        assert_eq!(one, "accelerate launch --cpu --mixed_precision bf16 --num_processes 1 train.py --lr 1");
        assert_eq!(two, "accelerate launch --mixed_precision bf16 --multi_gpu --num_processes 2 train.py --lr 1");
    }

    #[test]
    fn what_it_cannot_run_is_refused_with_the_reason() {
        let refused = |c: &str| parse(&words(c)).unwrap_err();
        assert!(refused("bash train.sh").contains("not a Python command"));
        assert!(refused("torchrun --nproc_per_node 2").contains("no script"));
        assert!(refused("python").contains("no script"));
        assert!(refused("torchrun --nnodes 1:2 train.py").contains("not one number of nodes"));
        assert!(refused("torchrun --nnodes 2 --node_rank x train.py").contains("not a whole number"));
        assert!(refused("accelerate launch --num_machines=3 train.py").contains("on 3 machines"));
    }

    #[test]
    fn across_nodes_the_ddp_leg_keeps_the_rendezvous_and_the_others_run_here() {
        let cmd = "torchrun --nnodes 2 --node_rank 1 --master_addr 10.0.0.1 --master_port 29500 train.py --k 1";
        let l = parse(&words(cmd)).unwrap();
        assert_eq!((l.nodes, l.node_rank), (2, Some(1)));
        assert_eq!(
            argv(&l, 4).join(" "),
            "torchrun --nnodes 2 --node_rank 1 --master_addr 10.0.0.1 --master_port 29500 --nproc_per_node 2 train.py --k 1"
        );
        assert_eq!(argv(&l, 1).join(" "), "torchrun --standalone --nproc_per_node 1 train.py --k 1");
        let l = parse(&words("torchrun --nnodes=3:3 --rdzv-backend=c10d --rdzv-endpoint=h:1 train.py")).unwrap();
        assert_eq!((l.nodes, l.node_rank), (3, None));
        assert_eq!(argv(&l, 1).join(" "), "torchrun --standalone --nproc_per_node 1 train.py");
    }

    #[test]
    fn words_with_spaces_or_quotes_are_quoted() {
        assert_eq!(quote("--lr"), "--lr");
        assert_eq!(quote("{acc_steps}"), "{acc_steps}");
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("it's"), r"'it'\''s'");
        let fills = [("n".to_string(), "6".to_string())];
        assert_eq!(filled(&["--n={n}".into(), "{k}".into()], &fills), ["--n=6", "{k}"]);
    }
}
