//! What was judged, in words: a run's configuration (table and Markdown headers) or the two
//! traces `compare` read, and how their elements were measured.

use std::fmt::Write;

use crate::evidence::{Magnitudes, RunKind};
use crate::judge::{Outcome, TracePair};
use crate::spec::{Config, DeviceKind, Dtype, TrainConfig};

/// Whether finals are shown as the worst tensors (a net) rather than every value (the
/// linear model, or a trace of at most two small tensors).
pub(crate) fn wide(o: &Outcome) -> bool {
    match o.config() {
        Some(cfg) => cfg.train.model.kind.is_deep(),
        None => o.accumulation.finals.len() > 2 || o.accumulation.finals.iter().any(|(_, t)| t.numel() > 16),
    }
}

/// The model's parameter tensors among the finals (AdamW's moments are finals too).
fn parameter_tensors(o: &Outcome) -> usize {
    o.accumulation.finals.iter().filter(|(n, _)| !n.starts_with("exp_avg")).count()
}

fn onoff(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
    }
}

/// Epochs, optimizer and sampler flags, as the deep models' table headers say them.
fn schedule(t: &TrainConfig) -> String {
    format!(
        "{} epochs{}, lr {}, momentum {}, weight decay {}, shuffle {}, drop_last {}",
        t.run.epochs,
        t.run.max_steps.map_or(String::new(), |m| format!(" (at most {m} steps)")),
        t.optim.lr,
        t.optim.momentum,
        t.optim.weight_decay,
        onoff(t.shape.shuffle),
        onoff(t.shape.drop_last)
    )
}

/// The optimizer step in words when it is not the article's (SGD, constant lr, no
/// clipping), else None.
pub(crate) fn optimizer_step(t: &TrainConfig) -> Option<String> {
    let o = &t.optim;
    if o.is_plain_sgd() {
        return None;
    }
    let mut words = match o.optimizer {
        crate::spec::Optimizer::AdamW => {
            format!("AdamW (betas {} {}, eps {}, weight decay {})", o.betas.0, o.betas.1, o.eps, t.optim.weight_decay)
        }
        crate::spec::Optimizer::Sgd => {
            format!("SGD (momentum {}, weight decay {})", t.optim.momentum, t.optim.weight_decay)
        }
    };
    words.push_str(&format!(", lr {} {}", t.optim.lr, o.lr_schedule));
    if let Some(x) = o.clip_grad_norm {
        words.push_str(&format!(", gradients clipped to norm {x} once per step"));
    }
    Some(words)
}

/// "batch B, K=k micro-batches per step vs W=w DDP ranks (engine)": every model's header.
fn split(t: &TrainConfig) -> String {
    let sh = &t.shape;
    format!(
        "batch {}, K={} micro-batches per step vs W={} DDP ranks ({})",
        sh.batch_size,
        sh.acc_steps,
        sh.gpus,
        engine(t)
    )
}

/// The table's header for a run.
pub(crate) fn run_table(s: &mut String, o: &Outcome, cfg: &Config) {
    let t = &cfg.train;
    let injected = |s: &mut String| {
        if let Some(b) = t.inject {
            let _ = writeln!(s, "injected bug: {} (planted in the {} run)", b.name(), b.side().name());
        }
    };
    let (sh, m) = (&t.shape, &t.model);
    let head =
        format!("ddp-verify: {} ({} parameter tensors, {})", m.kind.name(), parameter_tensors(o), t.precision.dtype);
    if m.kind.is_resnet() {
        let (size, classes) = (m.resnet.image_size, m.resnet.classes);
        let init = m.init.as_ref().map_or("seeded (ours)".to_string(), |p| p.display().to_string());
        let shape = format!("N={} images 3x{size}x{size}, {classes} classes", sh.data_size);
        let _ = writeln!(s, "{head}, {shape}, {}, {}, seed {}, init {init}", split(t), schedule(t), sh.seed);
        injected(s);
        let _ = writeln!(s, "mode: {}", mode(t));
    } else if m.kind.token_loss() {
        let lm = &m.lm;
        let shape =
            format!("N={} sequences of {}..={} tokens (vocab {})", sh.data_size, lm.min_len, lm.seq_len, lm.vocab);
        let window = t.run.partial_window;
        let _ =
            writeln!(s, "{head}, {shape}, {}, {}, partial window {window}, seed {}", split(t), schedule(t), sh.seed);
        injected(s);
        let _ = writeln!(s, "loss: {}", LOSS_WORDS);
        let _ = writeln!(s, "mode: {}", mode(t));
    } else {
        let _ = writeln!(
            s,
            "ddp-verify: linear model{}, N={} D={}, {}, {} epochs, lr {}, momentum {}, shuffle {}, drop_last {}, seed {}",
            dtype_note(t),
            t.shape.data_size,
            t.model.linear.features,
            split(t),
            t.run.epochs,
            t.optim.lr,
            t.optim.momentum,
            onoff(t.shape.shuffle),
            onoff(t.shape.drop_last),
            t.shape.seed,
        );
        injected(s);
        if t.run.lockstep {
            let _ = writeln!(s, "mode: {}", mode(t));
        }
    }
    if let Some(words) = optimizer_step(t) {
        let _ = writeln!(s, "optimizer: {words}");
    }
    if let Some(words) = amp_words(t) {
        let _ = writeln!(s, "amp: {words}");
        if let Some(record) = scaler_words(&o.accumulation.facts.scaler) {
            let _ = writeln!(s, "loss scaler (accumulation): {record}");
        }
    }
    if !cfg.device_note.is_empty() {
        let _ = writeln!(s, "device: {}, {} kernels", cfg.device_note, cfg.kernels.name());
    }
    if t.run.device == DeviceKind::Cuda {
        let _ = writeln!(s, "DDP collective: {}", engine(t));
    }
    if let Some(words) = all_reduced(o) {
        let _ = writeln!(s, "{words}");
    }
}

/// What the DDP run's ranks all-reduced per optimizer step (once, after the micro-batches
/// under no_sync), where recorded.
pub(crate) fn all_reduced(o: &Outcome) -> Option<String> {
    let c = o.ddp_cost()?;
    Some(format!(
        "ddp all-reduce: {} buckets, {} per rank per optimizer step (once per step, after the K/W micro-batches \
         under no_sync)",
        c.collectives?,
        crate::judge::size_words(c.megabytes?)
    ))
}

/// The Markdown header for a run.
pub(crate) fn run_markdown(s: &mut String, cfg: &Config) {
    let t = &cfg.train;
    if t.model.kind.is_resnet() {
        let _ = writeln!(
            s,
            "{} ({}), N={} images {}x{}, {} classes, batch {}: K={} accumulation steps vs W={} DDP ranks, {} epochs{}, lr {}, momentum {}, weight decay {}, shuffle {}, drop_last {}, seed {}.\n",
            t.model.kind.name(), t.precision.dtype.name(), t.shape.data_size, t.model.resnet.image_size, t.model.resnet.image_size, t.model.resnet.classes, t.shape.batch_size,
            t.shape.acc_steps, t.shape.gpus, t.run.epochs, t.run.max_steps.map_or(String::new(), |m| format!(" (at most {m} steps)")),
            t.optim.lr, t.optim.momentum, t.optim.weight_decay, t.shape.shuffle, t.shape.drop_last, t.shape.seed
        );
        let _ = writeln!(s, "Mode: {}.\n", mode(t));
    } else if t.model.kind.token_loss() {
        let _ = writeln!(
            s,
            "tiny-lm ({}), N={} sequences of {}..={} tokens (vocab {}), batch {}: K={} accumulation steps vs W={} DDP ranks, {} epochs{}, lr {}, momentum {}, weight decay {}, shuffle {}, drop_last {}, partial window {}, seed {}.\n",
            t.precision.dtype.name(), t.shape.data_size, t.model.lm.min_len, t.model.lm.seq_len, t.model.lm.vocab, t.shape.batch_size, t.shape.acc_steps, t.shape.gpus, t.run.epochs,
            t.run.max_steps.map_or(String::new(), |m| format!(" (at most {m} steps)")),
            t.optim.lr, t.optim.momentum, t.optim.weight_decay, t.shape.shuffle, t.shape.drop_last, t.run.partial_window.name(), t.shape.seed
        );
        let _ = writeln!(s, "Loss: {LOSS_WORDS}. Mode: {}.\n", mode(t));
    } else {
        let _ = writeln!(
            s,
            "Linear model{}, N={} D={}, batch {}: K={} accumulation steps vs W={} DDP ranks, {} epochs, lr {}, momentum {}, shuffle {}, drop_last {}, seed {}.\n",
            dtype_note(t), t.shape.data_size, t.model.linear.features, t.shape.batch_size, t.shape.acc_steps, t.shape.gpus, t.run.epochs, t.optim.lr, t.optim.momentum, t.shape.shuffle, t.shape.drop_last, t.shape.seed
        );
    }
    if let Some(words) = optimizer_step(t) {
        let _ = writeln!(s, "Optimizer: {words}.\n");
    }
    if let Some(words) = amp_words(t) {
        let _ = writeln!(s, "AMP: {words}.\n");
    }
    if !cfg.device_note.is_empty() {
        let _ =
            writeln!(s, "Device: {}, {} kernels, DDP ranks on {}.\n", cfg.device_note, cfg.kernels.name(), engine(t));
    }
}

/// `compare`'s header: each trace, what its header says, and what elements were measured at.
pub(crate) fn traces(o: &Outcome, pair: &TracePair) -> Vec<String> {
    let labels = [&o.runs.left, &o.runs.right];
    let steps = [o.runs.left_steps, o.runs.right_steps];
    let mut lines = vec!["ddp-verify compare: two recorded traces".to_string()];
    for i in 0..2 {
        let h = &pair.headers[i];
        let mut said = Vec::new();
        match (h.run, h.world_size) {
            (Some(RunKind::Ddp), Some(w)) => said.push(format!("DDP over W={w} ranks")),
            (Some(run), _) if run.is_one_process() => said.push("one process".to_string()),
            (Some(run), _) => said.push(format!("run {}", run.name())),
            (None, _) => said.push("no header".to_string()),
        }
        if let Some(k) = h.acc_steps {
            said.push(format!("K={k}"));
        }
        said.push(format!("{} steps", steps[i]));
        if let Some(d) = h.dtype {
            said.push(d.name().to_string());
        }
        if let Some(by) = &h.written_by {
            said.push(by.clone());
        } else if let Some(v) = &h.torch_version {
            said.push(format!("PyTorch {v}"));
        }
        lines.push(format!("  {:<12} {} ({})", labels[i], pair.paths[i].display(), said.join(", ")));
    }
    // A torch newer than the recorder was tested on: said once, where any trace's is.
    let untested =
        pair.headers.iter().filter_map(|h| h.torch_version.as_deref().and_then(crate::evidence::torch_untested));
    if let Some(words) = untested.max() {
        lines.push(words);
    }
    let tol = &pair.tolerance;
    lines.push(match &pair.precision {
        Some(Ok(h)) => format!(
            "held to: {} rounding at divisor ratio {}, measured by {} (each backward at that loss divisor, each \
             gradient divided back): each tensor within {} times the {} largest difference, plus {} ulp or rel {:e} \
             or abs {:e} (docs/mixed-precision.md)",
            h.dtype.name(),
            h.divisor,
            match h.both {
                true => "a control of each leg (they reach their precision otherwise)",
                false => "a control (the accumulation leg again)",
            },
            h.margin,
            if h.both { "controls'" } else { "control's" },
            tol.max_ulps,
            tol.rtol,
            tol.atol
        ),
        Some(Err(why)) => format!(
            "held to: {} ulp or rel {:e} or abs {:e}, float32's fixed tolerance: a leg ran narrower, and the \
             precision control measured nothing ({why})",
            tol.max_ulps, tol.rtol, tol.atol
        ),
        None => format!(
            "held to: the fixed tolerance, {} ulp or rel {:e} or abs {:e} (traces carry no bound derived from the \
             arithmetic)",
            tol.max_ulps, tol.rtol, tol.atol
        ),
    });
    if let Some(h) = pair.headers.iter().find(|h| h.reduce_dtype.is_some()) {
        let d = h.reduce_dtype.map_or("", |d| d.name());
        let how = match h.engine {
            Some(crate::evidence::Engine::Fsdp2) => "FSDP2's MixedPrecisionPolicy reduce-scatters in it",
            Some(e) if e.is_sharded() => "DeepSpeed's communication_data_type",
            _ => "the script's DDP comm hook casts each bucket",
        };
        lines.push(format!(
            "reduced in: {d} ({how}): equivalent up to the {d} reduction the script asked for, held to 2(W+1) times \
             its unit roundoff of the gradients' magnitudes"
        ));
    }
    let [ha, hb] = &pair.headers;
    if !ha.samples_comparable(hb) {
        let from = |h: &crate::evidence::TraceHeader| h.samples_from.clone().unwrap_or_default();
        lines.push(format!(
            "samples: not compared: {}'s were hashed from {} rows, {}'s from {} rows (other tensors: a wrapper's \
             whole batch in one leg, the model's inputs in the other), which stand for nothing in common",
            labels[0],
            from(ha),
            labels[1],
            from(hb)
        ));
    }
    for (c, what) in [(Some(&o.runs), "the runs"), (o.big_batch.as_ref().map(|b| &b.comparison), "the big batch")] {
        if let Some(r) = c.and_then(|c| c.regrouped) {
            lines.push(format!(
                "regrouped: {} step(s) of {what} hold the same samples in other micro-batches (another sampler's \
                 deal, or one big batch); held to up to {} times the tolerance, one kernel's rounding per \
                 micro-batch regrouped (docs/bounds.md)",
                r.steps, r.micro_batches
            ));
        }
    }
    lines.push(match &pair.finals_carried {
        Err(_) if matches!(pair.precision, Some(Ok(_))) => {
            "final weights: within the margin times the precision control's distance in its own final weights (the \
             same optimizer stepped through the same rounding), never less than the fixed tolerance"
                .to_string()
        }
        Ok(()) => "final weights: each step's allowance carried through AdamW (its betas, eps and learning rates \
                   as recorded), never less than the fixed tolerance"
            .to_string(),
        Err(why) => format!(
            "final weights: the fixed tolerance (no bound carried through the optimizer: {why}); where they part \
             beyond it under an optimizer that may amplify rounding (one that divides by a running magnitude, as \
             Adam's √v, turns a zero gradient's rounding noise into full steps), a control run decides"
        ),
    });
    lines.push(format!(
        "measured at: gradients, {}; final weights, {}",
        if pair.magnitudes && pair.headers.iter().any(|h| h.magnitudes == Some(Magnitudes::PerTensor)) {
            "the sum of each micro-batch gradient's largest magnitude per tensor, as recorded (or the tensor's largest value)"
        } else if pair.magnitudes {
            "the sum of the micro-batch gradients' magnitudes both traces recorded (or the tensor's largest value)"
        } else {
            "each tensor's largest value (the traces carry no micro-batch magnitudes)"
        },
        if pair.peaks {
            "each weight's largest magnitude during training, as recorded"
        } else {
            "their own values (the traces carry no peak magnitudes)"
        }
    ));
    if let Some(s) = &pair.sampling {
        lines.push(sampling_words(s, &pair.paths));
    }
    lines.extend(o.costs.iter().map(|c| format!("cost: {}", c.words())));
    for (path, h) in pair.paths.iter().zip(&pair.headers) {
        for w in h.warnings.iter().flat_map(|w| w.lines()) {
            lines.push(format!("not recorded in {}: {w}", path.display()));
        }
    }
    if let Some(others) = pair.headers.iter().find_map(|h| h.unrecorded_optimizers.as_ref()) {
        lines.push(format!(
            "not judged: the parameters of another optimizer that stepped ({others}); the recorder follows the \
             first optimizer to step"
        ));
    }
    lines
}

/// A sampled pair, in words: what was kept and how the rest is judged.
fn sampling_words(s: &crate::judge::SampledPair, paths: &[std::path::PathBuf; 2]) -> String {
    let mut w = format!(
        "sampled: {} elements of each of {} tensors (of {}) larger than that, at the same positions in both; \
         each whole tensor's sum, sum of squares and max |x| held to what its elements' allowances add up to",
        s.size, s.tensors, s.tensors_all
    );
    if let Some(p) = s.parameters {
        w.push_str(&format!(" ({} parameters)", count_words(p)));
    }
    if let Some(i) = s.recorded.iter().position(|r| !r) {
        w.push_str(&format!("; {} was recorded whole and sampled here", paths[i].display()));
    }
    w
}

/// A large count in words: 100.7M, 1.2B.
fn count_words(n: usize) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.1}B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.1}M", n as f64 / 1e6),
        n if n >= 10_000 => format!("{:.1}k", n as f64 / 1e3),
        n => n.to_string(),
    }
}

/// tiny-lm's normalisation, in words.
const LOSS_WORDS: &str = "token-level: the sum of per-token cross-entropy over the step's target tokens (all \
     micro-batches, all ranks) divided by their count; DDP ranks all-reduce their counts before backward";

/// The third run, in words: what it is, or why there is none.
/// `--amp` in words, None without it.
pub(crate) fn amp_words(t: &TrainConfig) -> Option<String> {
    let a = &t.precision.amp;
    let amp = a.amp?;
    let mut w = format!(
        "forward passes under autocast {0} (matrix products and convolutions in {0}, as torch.autocast on the CPU; \
         weights, gradients and optimizer state float32)",
        amp.name()
    );
    if a.scaled() {
        w.push_str(&format!(
            ", GradScaler from scale {} (growth interval {}), unscaled once per step after the all-reduce",
            a.init_scale, a.growth_interval
        ));
    }
    if let Some(step) = a.overflow_step {
        w.push_str(&format!(", step {step}: DDP rank {}'s first micro-batch made to overflow", t.shape.gpus - 1));
    }
    Some(w)
}

/// A scaler's record: its scale per step, and the steps it skipped.
fn scaler_words(r: &crate::evidence::ScalerRecord) -> Option<String> {
    if r.scales.is_empty() {
        return None;
    }
    let mut scales: Vec<String> = r.scales.iter().take(8).map(|v| v.to_string()).collect();
    if r.scales.len() > 8 {
        scales.push(format!("... ({} steps)", r.scales.len()));
    }
    let skipped: Vec<String> =
        r.found_inf.iter().enumerate().filter(|(_, f)| **f).map(|(s, _)| s.to_string()).collect();
    let skipped = if skipped.is_empty() { "none".to_string() } else { skipped.join(", ") };
    Some(format!("scale per step {}; skipped steps (inf/NaN): {skipped}", scales.join(", ")))
}

pub(crate) fn big_batch_words(t: &TrainConfig) -> &'static str {
    if t.precision.amp.amp.is_some() && t.model.kind.has_big_batch() {
        return "not run under --amp: its one batch rounds matrix products to the autocast dtype over K·B samples at \
                once, where accumulation rounds each micro-batch's, and no bound follows that";
    }
    match (t.model.kind.has_big_batch(), t.run.big_batch) {
        (true, true) => "one process, one micro-batch of each step's K·B samples, normalised over the whole step",
        (true, false) => "not run (--no-big-batch)",
        (false, _) => {
            "not run: BatchNorm normalises each micro-batch by its own statistics, so one batch of K·B samples is a \
             different computation"
        }
    }
}

/// Which mode the runs used, and why.
fn mode(t: &TrainConfig) -> String {
    if t.run.lockstep {
        let why = if t.model.kind.is_resnet() {
            "the default for ResNets: a deep BatchNorm net amplifies float32 rounding about a million-fold per step, \
             so free-running runs drift apart although they are equivalent; --free-running shows that drift"
        } else if t.model.kind.is_deep() {
            "the default for deep nets: rounding carries from step to step in a free-running run; --free-running shows it"
        } else {
            "asked for with --lockstep"
        };
        let who = if t.with_big_batch() { "DDP (and the big batch)" } else { "DDP" };
        let what = if t.model.kind.is_resnet() { "weights and BatchNorm buffers" } else { "weights" };
        format!(
            "lockstep: before every optimizer step {who} restarts from the accumulation run's {what}, so each step's \
             difference is that step's arithmetic alone ({why})"
        )
    } else if t.model.kind.is_deep() {
        let note = if t.precision.dtype == Dtype::Float64 {
            "float64 rounding is 2^29 times finer than float32's, so equivalent runs stay close"
        } else {
            "in float32 rounding differences grow step by step, so later steps may drift (use --lockstep or --dtype float64)"
        };
        format!("free-running: each run trains on its own ({note})")
    } else {
        "free-running".into()
    }
}

/// " (bfloat16)" after the linear model's name; nothing for its float32 default.
fn dtype_note(t: &TrainConfig) -> String {
    if t.precision.dtype == Dtype::Float32 {
        String::new()
    } else {
        format!(" ({})", t.precision.dtype.name())
    }
}

/// The collective engine the DDP ranks used.
fn engine(t: &TrainConfig) -> String {
    match (t.run.device, t.run.shared_gpus) {
        (DeviceKind::Cpu, _) => "Open MPI".into(),
        (DeviceKind::Cuda, None) => "NCCL".into(),
        (DeviceKind::Cuda, Some(g)) => {
            format!("Open MPI over host memory, {} ranks on {g} GPU{}", t.shape.gpus, if g == 1 { "" } else { "s" })
        }
    }
}
