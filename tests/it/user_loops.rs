//! Users' own training code, unmodified: `ddp-verify --acc-steps K --gpus W -- python
//! train.py` on the examples (a nanoGPT-style loop, Transformers' Trainer, Lightning,
//! Accelerate), honest and with the bugs people hit; each verdict with its cause.

use std::process::Command;

use crate::util::{ddp_verify, flags, repo, stderr, stdout, users};

/// Runs an example as both legs and returns (exit code, the JSON report). A leg that fails
/// (exit 3: torchrun's rendezvous under a loaded machine) is run once more, said in the log.
pub(crate) fn zero_edit(example: &str, extra: &str) -> (Option<i32>, serde_json::Value) {
    zero_edit_with(&[&users("python")], example, extra)
}

/// `zero_edit` with the script started by `launcher` (python, torchrun, accelerate launch).
pub(crate) fn zero_edit_with(launcher: &[&str], example: &str, extra: &str) -> (Option<i32>, serde_json::Value) {
    run_legs(launcher, example, extra, false)
}

/// `zero_edit`, the legs' traces sampled (`--sample 16`: 16 elements of each larger tensor and
/// each whole tensor's summaries), held to the same verdict and cause a whole trace gets: about
/// half the examples' cases here run so, in place of running them all again sampled.
pub(crate) fn zero_edit_sampled(example: &str, extra: &str) -> (Option<i32>, serde_json::Value) {
    run_legs(&[&users("python")], example, extra, true)
}

fn run_legs(launcher: &[&str], example: &str, extra: &str, sample: bool) -> (Option<i32>, serde_json::Value) {
    let t = tempfile::tempdir().unwrap();
    let report = t.path().join("report.json").display().to_string();
    let script = repo(&format!("examples/{example}/train.py")).display().to_string();
    let mut args = flags("--acc-steps 4 --gpus 2 --report json --report-file");
    args.push(report.as_str());
    if sample {
        args.extend(["--sample", "16"]);
    }
    // DDP_VERIFY_KEEP_TRACES=DIR keeps each case's traces and logs (bench/causes.py judges
    // them again with two builds).
    let kept = keep_traces(launcher, example, extra);
    if let Some(dir) = &kept {
        args.extend(["--force", "--save-trace", dir.as_str()]);
    }
    args.push("--");
    args.extend(launcher);
    args.push(&script);
    args.extend(flags(extra));
    let mut out = ddp_verify(&args);
    if out.status.code() == Some(3) {
        eprintln!("{example} {extra}: a leg failed once, running again:\n{}", stderr(&out));
        std::fs::remove_file(&report).ok();
        out = ddp_verify(&args);
    }
    let text = std::fs::read_to_string(&report).unwrap_or_else(|e| panic!("{e}: {}{}", stdout(&out), stderr(&out)));
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    // Sampled where asked (or where DDP_VERIFY_SAMPLE is set for the whole run): it must have been.
    if let Some(n) = sample.then(|| "16".to_string()).or_else(|| std::env::var("DDP_VERIFY_SAMPLE").ok()) {
        assert_eq!(json["traces"]["sampling"]["size"].to_string(), n, "{example} {extra}: {json}");
    }
    (out.status.code(), json)
}

/// The folder under `DDP_VERIFY_KEEP_TRACES` for one case, named by its launcher, example
/// and arguments; None where the variable is unset.
pub(crate) fn keep_traces(launcher: &[&str], example: &str, extra: &str) -> Option<String> {
    let root = std::env::var_os("DDP_VERIFY_KEEP_TRACES")?;
    let by = launcher.last().and_then(|l| l.rsplit('/').next()).unwrap_or("python");
    let slug: String = format!("{example} {by} {extra}")
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '.' { c } else { '_' })
        .collect();
    Some(std::path::Path::new(&root).join(slug).display().to_string())
}

pub(crate) fn reason(report: &serde_json::Value) -> &str {
    report["diagnosis"]["reason"].as_str().unwrap_or("none")
}

/// Runs an example with a planted bug and holds it NOT EQUIVALENT (exit 1) with `want` as
/// the cause, whose detail says `says` where given.
pub(crate) fn caught(example: &str, extra: &str, want: &str, says: Option<&str>) {
    held(zero_edit(example, extra), want, says)
}

/// `caught` with sampled traces (`zero_edit_sampled`).
fn caught_sampled(example: &str, extra: &str, want: &str, says: Option<&str>) {
    held(zero_edit_sampled(example, extra), want, says)
}

fn held((code, bug): (Option<i32>, serde_json::Value), want: &str, says: Option<&str>) {
    assert_eq!((code, reason(&bug)), (Some(1), want), "{bug}");
    if let Some(phrase) = says {
        assert!(bug["diagnosis"]["detail"].as_str().unwrap_or_default().contains(phrase), "{bug}");
    }
}

/// An honest AdamW loop of an attention model: the key bias's true gradient is zero, its
/// recorded values rounding noise that Adam turns into full steps; judged by the allowance
/// carried through AdamW, not a false alarm.
#[test]
fn nanogpt_honest_is_equivalent_and_the_sync_after_forward_bug_is_named() {
    let (code, honest) = zero_edit("nanogpt", "--grad-accum {acc_steps}");
    assert_eq!(code, Some(0), "{honest}");
    // K=4 over 2 ranks: each rank's second micro-batch ran its forward with the flag False.
    let sync = "micro-batch 2 of this rank's 2 ran the backward without DDP's all-reduce";
    caught("nanogpt", "--grad-accum {acc_steps} --bug sync-after-forward", "unsynchronised gradient", Some(sync));
    caught_sampled(
        "nanogpt",
        "--grad-accum {acc_steps} --bug forward-raw-model",
        "unsynchronised gradient",
        Some("no DistributedDataParallel forward ran"),
    );
    caught_sampled(
        "nanogpt",
        "--grad-accum {acc_steps} --bug step-every-micro-batch",
        "step count",
        Some("neither run accumulates"),
    );
}

/// Other adaptive optimizers on the same honest loop: Adam without weight decay carries
/// AdamW's bound; RMSprop carries none, and its √v turns the key bias's rounding noise into
/// full steps, so its final weights part beyond the fixed tolerance: a control run proves
/// that rounding (never "not judged" counted as agreeing), and there is no false alarm.
#[test]
fn nanogpt_honest_under_adam_and_rmsprop_is_equivalent() {
    let (code, adam) = zero_edit("nanogpt", "--grad-accum {acc_steps} --optimizer adam");
    assert_eq!((code, adam["runs"]["derived"].as_bool()), (Some(0), Some(true)), "{adam}");
    let (code, rms) = zero_edit_sampled("nanogpt", "--grad-accum {acc_steps} --optimizer rmsprop");
    // Whole traces part beyond the fixed tolerance and a control proves it ("chaos"); sampled
    // ones (these) may keep no element that parts, and need none.
    assert_eq!(code, Some(0), "{rms}");
    assert!(rms["caution"].is_null() || rms["caution"]["reason"] == "chaos", "{rms}");
    assert!(rms["runs"]["finals"]["not_judged"].is_null(), "{rms}");
}

/// With `--batch {batch}` the script also runs as one big batch: Transformers PR 34191's
/// per-micro-batch mean, which accumulation and DDP share, shows there, with its cause.
#[test]
fn transformers_trainer_honest_is_equivalent_and_dividing_again_is_named() {
    let (code, honest) = zero_edit("transformers", "--grad-accum {local_acc_steps} --batch {batch}");
    assert_eq!(code, Some(0), "{honest}");
    assert_eq!(honest["traces"]["right"]["meta"]["framework"], "transformers", "{honest}");
    assert_eq!(honest["big_batch"]["comparison"]["verdict"], "within-tolerance", "{honest}");
    let (code, bug) =
        zero_edit_sampled("transformers", "--grad-accum {local_acc_steps} --batch {batch} --bug mean-per-micro-batch");
    assert_eq!(code, Some(1), "{bug}");
    assert_eq!(bug["runs"]["verdict"], "within-tolerance", "{bug}");
    assert_eq!(bug["big_batch"]["diagnosis"]["reason"], "per-micro-batch mean", "{bug}");
    // GPT-2's default dropout: the runs draw their own masks, named before anything finer.
    caught_sampled("transformers", "--grad-accum {local_acc_steps} --dropout 0.1", "dropout masks", None);
    caught(
        "transformers",
        "--grad-accum {local_acc_steps} --bug divide-by-accumulation",
        "loss scaling",
        Some("Trainer"),
    );
}

#[test]
fn lightning_honest_is_equivalent_and_dividing_again_is_named() {
    let (code, honest) = zero_edit_sampled("lightning", "--grad-accum {local_acc_steps} --gpus {gpus}");
    assert_eq!(code, Some(0), "{honest}");
    // Batches of (ids, x, y): under DDP Lightning's wrapper forwards the whole batch (the ids
    // hashed as samples), one process's network only x. Hashes of other tensors are not
    // compared: the cause is the scaling, not "different samples" owned by Lightning.
    caught(
        "lightning",
        "--grad-accum {local_acc_steps} --gpus {gpus} --bug divide-by-k --with-ids",
        "loss scaling",
        Some("Lightning"),
    );
}

#[test]
fn accelerate_honest_is_equivalent_and_its_bugs_are_named_through_clipping() {
    let (code, honest) = zero_edit("accelerate", "--grad-accum {local_acc_steps}");
    assert_eq!(code, Some(0), "{honest}");
    caught_sampled(
        "accelerate",
        "--grad-accum {local_acc_steps} --bug scheduler-per-process",
        "learning-rate schedule",
        None,
    );
    caught_sampled(
        "accelerate",
        "--grad-accum {local_acc_steps} --bug divide-by-k --clip 0.3",
        "loss scaling",
        Some("clipping ran on ddp only"),
    );
    // Clipped on both sides at every step: the applied gradients agree, but the recorded
    // scaling shows the 2x factor between the norms before clipping: a fact apart decides
    // (NOT EQUIVALENT), named as the loss divided twice, with clipping said to hide it.
    let (code, bug) = zero_edit("accelerate", "--grad-accum {local_acc_steps} --bug divide-by-k --clip 0.01");
    assert_eq!((code, reason(&bug)), (Some(1), "loss scaling"), "{bug}");
    let detail = bug["diagnosis"]["detail"].as_str().unwrap();
    assert!(detail.starts_with("clipping hid it") && detail.contains("divided twice"), "{bug}");
    assert_eq!(bug["runs"]["hidden_factor"].as_f64().map(|f| (f * 1e4).round() / 1e4), Some(2.0), "{bug}");
}

/// The launchers users start their scripts with: their own options kept, the number of
/// processes set per leg (1, then W), whatever count the command gave.
#[test]
fn torchrun_and_accelerate_launch_commands_run_as_the_legs() {
    let bin = users;
    let worlds = |r: &serde_json::Value| {
        let world = |side: &str| r["traces"][side]["meta"]["world_size"].as_str().unwrap_or("?").to_string();
        (world("left"), world("right"))
    };
    let torchrun = bin("torchrun");
    let (code, r) = zero_edit_with(
        &[&torchrun, "--nproc_per_node", "8", "--max-restarts", "0"],
        "nanogpt",
        "--grad-accum {acc_steps}",
    );
    assert_eq!((code, worlds(&r)), (Some(0), ("1".into(), "2".into())), "{r}");
    let accelerate = bin("accelerate");
    let launch = [accelerate.as_str(), "launch", "--cpu", "--num_processes", "3", "--mixed_precision", "no"];
    let (code, r) = zero_edit_with(&launch, "accelerate", "--grad-accum {local_acc_steps}");
    assert_eq!((code, worlds(&r)), (Some(0), ("1".into(), "2".into())), "{r}");
}

/// The Python sampler deals exactly what `ddp-verify split` prints, over shapes with
/// shuffling, seeds, epochs, padding and drop_last.
#[test]
fn the_python_sampler_is_ddp_verify_split() {
    let mut cases = Vec::new();
    for (n, w, b) in [(10, 2, 2), (7, 3, 2), (16, 4, 3), (5, 2, 4), (2, 3, 1)] {
        for (shuffle, drop_last, seed, epoch) in [(false, false, 0, 0), (true, false, 3, 1), (true, true, 0, 2)] {
            cases.push((n, w, b, shuffle, drop_last, seed, epoch));
        }
    }
    let code = "import json, sys\nfrom ddp_verify_trace import accumulation_order\n\
                for n, w, b, s, d, seed, e in json.load(sys.stdin):\n    \
                print(json.dumps(accumulation_order(n, w, b, shuffle=s, seed=seed, epoch=e, drop_last=d)))\n";
    let mut py = Command::new(repo(".venv/bin/python"))
        .args(["-c", code])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    py.stdin.take().unwrap().write_all(serde_json::to_string(&cases).unwrap().as_bytes()).unwrap();
    let out = py.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let python: Vec<serde_json::Value> = stdout(&out).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(python.len(), cases.len());
    for ((n, w, b, shuffle, drop_last, seed, epoch), py) in cases.iter().zip(python) {
        let mut args = format!(
            "split --json --data-size {n} --gpus {w} --batch-size {b} --acc-steps {w} --seed {seed} --epoch {epoch}"
        );
        if *shuffle {
            args.push_str(" --shuffle");
        }
        if *drop_last {
            args.push_str(" --drop-last");
        }
        let out = ddp_verify(&flags(&args));
        assert_eq!(out.status.code(), Some(0), "{args}: {}", stderr(&out));
        let split: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
        assert_eq!(split["accumulation_order"], py, "{args}");
    }
}

/// Commands the zero-edit mode cannot run are refused in one line before anything runs.
#[test]
fn commands_it_cannot_run_are_refused_in_one_line() {
    let script = repo("examples/nanogpt/train.py").display().to_string();
    let python = repo(".venv/bin/python").display().to_string();
    let torchrun = repo(".venv/bin/torchrun").display().to_string();
    for (line, says) in [
        ("--acc-steps 4 --gpus 2 -- bash run.sh", "not a Python command"),
        ("--acc-steps 4 --gpus 1 -- PY SCRIPT", "--gpus"),
        ("--acc-steps 3 --gpus 2 -- PY SCRIPT", "--acc-steps"),
        ("--acc-steps 4 --gpus 2 --timeout 0 -- PY SCRIPT", "--timeout"),
        ("--acc-steps 4 --gpus 2 --save-trace /proc/ddp-verify -- PY SCRIPT", "--save-trace"),
        ("--acc-steps 4 --gpus 2 --batch-size 18446744073709551615 -- PY SCRIPT", "--batch-size"),
        ("--acc-steps 4 --gpus 2 --sample 0 -- PY SCRIPT", "--sample"),
        ("--acc-steps 4 --gpus 2 --sample 16", "--sample"),
        ("--acc-steps 4 --gpus 2 -- TR --nnodes 2 SCRIPT", "--node-rank"),
        ("--acc-steps 4 --gpus 2 --node-rank 1 -- PY SCRIPT", "--node-rank"),
        ("--acc-steps 4 --gpus 2 -- TR --nnodes 2 --node_rank 2 SCRIPT", "--node-rank"),
        ("--acc-steps 3 --gpus 3 -- TR --nnodes 2 --node_rank 0 SCRIPT", "--gpus"),
        ("--acc-steps 4 --gpus 2 -- TR --nnodes 1:2 SCRIPT", "--nnodes"),
        ("--acc-steps 4 --gpus 2 --node-rank 1", "--node-rank"),
    ] {
        let args: Vec<String> = flags(line)
            .into_iter()
            .map(|a| a.replace("PY", &python).replace("TR", &torchrun).replace("SCRIPT", &script))
            .collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = ddp_verify(&args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{line}: {err}");
        assert_eq!(err.lines().count(), 1, "{line}: {err}");
        assert!(err.contains(says), "{line}: {err}");
    }
}

/// A setting the recorder refuses at start-up makes the leg run unrecorded: bad input (exit
/// 2), one line quoting the refusal.
#[test]
fn a_setting_the_recorder_refuses_is_named() {
    let script = repo("examples/nanogpt/train.py").display().to_string();
    let python = repo(".venv/bin/python").display().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_ddp-verify"))
        .args(["--acc-steps", "4", "--gpus", "2", "--", &python, &script, "--grad-accum", "{acc_steps}"])
        .env("DDP_VERIFY_SAMPLE", "bogus")
        .output()
        .unwrap();
    let err = stderr(&out);
    assert_eq!((out.status.code(), err.lines().count()), (Some(2), 1), "{err}");
    assert!(err.contains("ran unrecorded: ValueError: ddp_verify_trace: DDP_VERIFY_SAMPLE='bogus'"), "{err}");
}

/// A script that fails is a leg failure (exit 3) naming the leg and its last line; it
/// leaves no trace behind to be judged.
#[test]
fn a_failing_script_is_exit_3_naming_the_leg_and_its_error() {
    let t = tempfile::tempdir().unwrap();
    let script = t.path().join("boom.py");
    std::fs::write(&script, "raise SystemExit('no data here')\n").unwrap();
    let dir = t.path().join("out").display().to_string();
    let python = repo(".venv/bin/python").display().to_string();
    let out = ddp_verify(&[
        "--acc-steps",
        "2",
        "--gpus",
        "2",
        "--save-trace",
        &dir,
        "--",
        &python,
        &script.to_string_lossy(),
    ]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("the accumulation leg") && err.contains("no data here"), "{err}");
    assert!(!t.path().join("out/accumulation.safetensors").exists());
}

/// Off a terminal (CI), each leg says one line when it ends, with the optimizer steps it
/// made; nothing is redrawn.
#[test]
fn each_leg_says_one_line_with_its_steps_when_it_ends() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().display().to_string();
    let python = repo(".venv/bin/python").display().to_string();
    let script = repo("examples/nanogpt/train.py").display().to_string();
    let out = ddp_verify(&[
        "--acc-steps",
        "4",
        "--gpus",
        "2",
        "--save-trace",
        &dir,
        "--",
        &python,
        &script,
        "--grad-accum",
        "{acc_steps}",
        "--samples",
        "16",
    ]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("ddp-verify: the accumulation leg: 2 optimizer steps in "), "{err}");
    assert!(err.contains("ddp-verify: the ddp leg: 2 optimizer steps in "), "{err}");
    assert!(!err.contains('\r') && !err.contains('\x1b'), "{err}");
    assert!(!t.path().join("ddp.progress").exists(), "the count is not left beside the traces");
}

/// Two nodes on one machine, one ddp-verify each with the same command, meeting in a c10d
/// rendezvous at 127.0.0.1 and sharing one --save-trace folder: node 0 judges (node 1 started
/// first, so global rank 0 and the DDP trace are likely node 1's), node 1 runs its share and
/// exits 0.
#[test]
fn two_nodes_meet_in_the_ddp_leg_and_node_0_judges() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().display().to_string();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let endpoint = format!("127.0.0.1:{port}");
    let torchrun = repo(".venv/bin/torchrun").display().to_string();
    let script = repo("examples/nanogpt/train.py").display().to_string();
    let node = |rank: &str| {
        Command::new(env!("CARGO_BIN_EXE_ddp-verify"))
            .args(["--acc-steps", "4", "--gpus", "2", "--node-rank", rank, "--save-trace", &dir, "--", &torchrun])
            .args(["--nnodes", "2", "--rdzv_backend", "c10d", "--rdzv_endpoint", &endpoint, "--rdzv_id", "t"])
            .args([&script, "--grad-accum", "{acc_steps}", "--samples", "16"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let one = node("1");
    std::thread::sleep(std::time::Duration::from_secs(2));
    let zero = node("0").wait_with_output().unwrap();
    let one = one.wait_with_output().unwrap();
    let (err0, err1) = (stderr(&zero), stderr(&one));
    assert_eq!(zero.status.code(), Some(0), "{err0}\n{err1}");
    assert!(stdout(&zero).contains("EQUIVALENT"), "{}", stdout(&zero));
    assert_eq!(one.status.code(), Some(0), "{err1}");
    assert!(err1.contains("node 1: its share of the ddp leg ended"), "{err1}");
    assert!(stdout(&one).is_empty(), "node 1 reports nothing");
    for f in ["ddp.log", "ddp.node1.log", "ddp.safetensors", "accumulation.safetensors"] {
        assert!(t.path().join(f).is_file(), "{f}");
    }
}

/// A DDP leg whose rank 1 raises (FSDP2's divide factor on gloo does): the exception and the
/// rank are quoted, not torchrun's closing banner.
#[test]
fn a_rank_that_raises_is_quoted_by_its_exception_and_rank() {
    let t = tempfile::tempdir().unwrap();
    let script = t.path().join("train.py");
    std::fs::write(
        &script,
        "import torch, torch.distributed as dist\n\
         dist.init_process_group('gloo')\n\
         if dist.get_world_size() > 1 and dist.get_rank() == 1:\n\
         \x20   raise RuntimeError('Cannot use ReduceOp.PREMUL_SUM with Gloo')\n\
         m = torch.nn.Linear(2, 1)\n\
         opt = torch.optim.SGD(m.parameters(), lr=0.1)\n\
         m(torch.ones(1, 2)).sum().backward()\n\
         opt.step()\n\
         dist.barrier()\n",
    )
    .unwrap();
    let torchrun = repo(".venv/bin/torchrun").display().to_string();
    let out = ddp_verify(&["--acc-steps", "2", "--gpus", "2", "--", &torchrun, &script.to_string_lossy()]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("the ddp leg"), "{err}");
    assert!(err.contains("rank 1 raised RuntimeError: Cannot use ReduceOp.PREMUL_SUM with Gloo"), "{err}");
}

/// A leg that hangs after recording steps is stopped at --timeout (exit 3), and the trace it
/// was streaming goes with it: no `.part` is left in the output directory.
#[test]
fn a_hung_leg_is_stopped_and_leaves_no_partial_trace() {
    let t = tempfile::tempdir().unwrap();
    let script = t.path().join("hang.py");
    let code = "import time, torch\nm = torch.nn.Linear(3, 1); o = torch.optim.SGD(m.parameters(), lr=0.1)\n\
                for _ in range(3):\n    m(torch.ones(2, 3)).sum().backward(); o.step(); o.zero_grad()\n\
                time.sleep(600)\n";
    std::fs::write(&script, code).unwrap();
    let dir = t.path().join("out");
    let python = repo(".venv/bin/python").display().to_string();
    let args = ["--acc-steps", "2", "--gpus", "2", "--timeout", "6", "--save-trace", &dir.display().to_string()];
    let mut args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    args.extend(["--".into(), python, script.display().to_string()]);
    let out = ddp_verify(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, ["accumulation.log"], "{}", stderr(&out));
}

/// A "DDP" leg that ran as one process (`accelerate launch --cpu` without --multi_gpu): its
/// trace says world size 1, and that is the cause named, not the step counts it leads to.
#[test]
fn a_ddp_leg_run_as_one_process_is_named() {
    let t = tempfile::tempdir().unwrap();
    let autoload = repo("python/ddp_verify_trace/autoload");
    let leg = |name: &str, k: &str| {
        let trace = t.path().join(format!("{name}.safetensors"));
        let out = Command::new(repo(".venv/bin/python"))
            .arg(repo("examples/nanogpt/train.py"))
            .args(["--grad-accum", k, "--world", "2"])
            .env("PYTHONPATH", &autoload)
            .env("DDP_VERIFY_TRACE", &trace)
            .env("DDP_VERIFY_LEG", name)
            .env("OMP_NUM_THREADS", "1")
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        trace.display().to_string()
    };
    // The "DDP" process accumulates K/W = 2 as each of its ranks would have.
    let (acc, ddp) = (leg("accumulation", "4"), leg("ddp", "2"));
    let out = ddp_verify(&["compare", &acc, &ddp, "--report", "json"]);
    let report: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!((out.status.code(), reason(&report)), (Some(1), "one process"), "{report}");
}
