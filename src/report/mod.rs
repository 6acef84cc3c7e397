//! What the user reads, one format per file behind one small trait (hyperfine's export
//! layout): a table for people, JSON for machines, Markdown for a pull-request comment,
//! JUnit XML for CI systems. `-` or no file means stdout.

mod describe;
mod json;
mod junit;
mod markdown;
pub mod plot;
pub mod suite;
mod table;
pub mod watch;

use std::io::Write as _;
use std::path::PathBuf;

use crate::error::{Error, Result};
use crate::judge::{Agreement, Comparison, GroupDiff, Outcome, Subject};
use crate::spec::{Format, ReportTarget};

pub use json::JSON_SCHEMA_VERSION;

pub trait Exporter {
    fn render(&self, o: &Outcome) -> String;
}

/// The exporter for `format`.
pub fn exporter(format: Format) -> Box<dyn Exporter> {
    match format {
        Format::Table => Box::new(table::Table),
        Format::Json => Box::new(json::Json),
        Format::Markdown => Box::new(markdown::Markdown),
        Format::Junit => Box::new(junit::Junit),
    }
}

/// `o` as `format` renders it.
pub fn render(format: Format, o: &Outcome) -> String {
    exporter(format).render(o)
}

/// Refuses, before anything runs, report files that exist (without --force), cannot be
/// created, or are asked for twice.
pub fn check_targets(targets: &[ReportTarget], plot: Option<&PathBuf>, force: bool) -> Result<()> {
    let files = targets.iter().filter_map(ReportTarget::file).map(|p| ("--report-file", p.as_path()));
    let all: Vec<(&'static str, &std::path::Path)> = files.chain(plot.map(|p| ("--plot", p.as_path()))).collect();
    crate::outputs::check_distinct(all.iter().copied())?;
    for (flag, path) in all {
        crate::outputs::check_file(flag, path, force)?;
    }
    Ok(())
}

/// Writes the reports, and the plot when asked for.
pub fn write_all(o: &Outcome, targets: &[ReportTarget]) -> Result<()> {
    // Nothing was compared without a verdict: no plot.
    let plot = o
        .plot()
        .filter(|_| o.no_verdict.is_none())
        .into_iter()
        .map(|p| (Box::new(plot::Plot) as Box<dyn Exporter>, Some(p)));
    let reports = targets.iter().map(|t| (exporter(t.format), t.file()));
    for (exporter, file) in plot.chain(reports) {
        emit(&exporter.render(o), file)?;
    }
    Ok(())
}

/// `text` to `file`, or to stdout.
fn emit(text: &str, file: Option<&PathBuf>) -> Result<()> {
    match file {
        Some(path) => std::fs::write(path, text).map_err(|e| Error::io(format!("writing {}", path.display()), e)),
        None => {
            // A verdict nobody could read is a failure, not a pass (`> /dev/full`).
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes())
                .and_then(|()| out.flush())
                .map_err(|e| Error::io("writing the report to standard output", e))
        }
    }
}

pub(crate) fn escape_xml(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;").replace('\'', "&apos;")
}

pub(crate) fn row(g: &GroupDiff) -> String {
    if let Some(why) = g.not_judged {
        return format!("{:>10}  {:>10}  {:>8}  {:>8}  {}", "-", "-", "-", "-", why.label());
    }
    format!(
        "{:>10}  {:>10}  {:>8}  {:>8}  {}",
        num(g.max_abs),
        num(g.max_rel),
        ulps(g.max_ulps),
        fraction(g.worst_fraction),
        g.verdict.label()
    )
}

/// The largest |Δ| as a fraction of what was allowed ("used"): 1 is the edge.
pub fn fraction(x: f64) -> String {
    match x {
        0.0 => "0".into(),
        x if x.is_infinite() => "inf".into(),
        x if (0.01..1000.0).contains(&x) => format!("{x:.2}"),
        x => format!("{x:.1e}"),
    }
}

/// Worst first: diverged before passed, then by the fraction of the allowance used.
pub(crate) fn worst_first(ds: &mut [&crate::judge::TensorDiff]) {
    ds.sort_by(|a, b| {
        let key = |d: &crate::judge::TensorDiff| (d.verdict, d.worst_fraction, d.max_ulps);
        key(b).partial_cmp(&key(a)).unwrap_or(std::cmp::Ordering::Equal)
    });
}

/// What elements were held to, in words.
pub(crate) fn bound_words(o: &Outcome) -> String {
    let tol = o.tolerance();
    if let Subject::Traces(pair) = &o.subject {
        if let Some(Ok(h)) = &pair.precision {
            return format!(
                "{} times the precision {} largest difference per tensor ({} rounding at divisor ratio {}, \
                 measured) plus {} ulp or rel {:e} or abs {:e}",
                h.margin,
                if h.both { "controls'" } else { "control's" },
                h.dtype.name(),
                h.divisor,
                tol.max_ulps,
                tol.rtol,
                tol.atol
            );
        }
    }
    if let (Subject::Traces(_), true) = (&o.subject, o.runs.derived) {
        return format!(
            "{} ulp or rel {:e} or abs {:e}, carried through AdamW's steps to the final weights",
            tol.max_ulps, tol.rtol, tol.atol
        );
    }
    if o.runs.derived {
        "the bound derived from the arithmetic (twice the rounding DDP's order and loss scaling can cause, per element)"
            .into()
    } else {
        format!("{} ulp or rel {:e} or abs {:e}", tol.max_ulps, tol.rtol, tol.atol)
    }
}

pub(crate) fn summary(c: &Comparison) -> String {
    let worst = c.steps.iter().chain([&c.finals]).map(|g| g.max_ulps).max().unwrap_or(0);
    let steps = if c.left_steps == c.right_steps {
        format!("{} steps + final weights", c.left_steps)
    } else {
        format!("{} vs {} steps", c.left_steps, c.right_steps)
    };
    // NaN or Inf (or a missing tensor) has no ulp distance: say what it was instead.
    let problem = c
        .steps
        .iter()
        .chain([&c.finals])
        .flat_map(|g| &g.tensors)
        .find_map(|t| t.problem.as_ref().map(|p| format!("{}: {p}", t.name)));
    match problem {
        Some(p) => format!("{steps}: {} ({p})", c.verdict.label()),
        None => format!("{steps}, max {} ulp: {}", ulps(worst), c.verdict.label()),
    }
}

pub(crate) fn verdict_line(o: &Outcome) -> String {
    if let Some(why) = &o.no_verdict {
        return why.line();
    }
    let bound = bound_words(o);
    let all = o.comparisons();
    let worst = all.iter().flat_map(|c| c.steps.iter().chain([&c.finals])).map(|g| g.max_ulps).max().unwrap_or(0);
    if o.caution.as_ref().is_some_and(|c| c.reason == crate::judge::Reason::Chaos) {
        return format!(
            "EQUIVALENT: step 0 within {bound}; later steps and the final weights part only as far as rounding \
             amplified, proven by a control run (within {:.0}x its distance)",
            crate::judge::CONTROL_MARGIN
        );
    }
    if o.agreement() != Agreement::Diverged {
        let used = all.iter().map(|c| c.worst_fraction).fold(0.0, f64::max);
        let parted = all.iter().find_map(|c| c.range_parted.as_ref());
        let unjudged = all.iter().any(|c| c.finals.not_judged == Some(crate::judge::NotJudged::Optimizer));
        let what = match (parted.is_some(), unjudged) {
            (true, _) => "every judged gradient and weight",
            (false, true) => "every gradient (final weights not judged)",
            (false, false) => "every gradient and final weight",
        };
        return format!(
            "EQUIVALENT: {what} within {bound} ({}){}",
            worst_words(worst, used),
            parted.map_or(String::new(), range_words)
        );
    }
    let first = all.iter().find(|c| c.verdict == Agreement::Diverged).expect("a diverged comparison");
    if let Some((d, p)) = first.rank_drift.as_ref().and_then(|d| Some((d, d.unsynced_grad()?))) {
        return format!(
            "NOT EQUIVALENT: DDP rank {}'s gradient of {p} differs from rank 0's at step {}: not synchronised",
            d.rank, d.step
        );
    }
    if let Some(d) = &first.rank_drift {
        return format!(
            "NOT EQUIVALENT: DDP rank {} held another {} than rank 0 after step {}",
            d.rank, d.tensor, d.step
        );
    }
    if let Some(l) = first.lr {
        return format!(
            "NOT EQUIVALENT: {} applied learning rate {} at step {} where {} applied {}",
            first.left,
            crate::judge::LrMismatch::shown(l.left),
            l.step,
            first.right,
            crate::judge::LrMismatch::shown(l.right)
        );
    }
    if let Some(m) = first.scaler {
        return format!("NOT EQUIVALENT: {}", m.describe(&first.left, &first.right));
    }
    if let Some(f) = first.hidden_factor {
        return format!(
            "NOT EQUIVALENT: {}'s gradients before clipping were {f:.4}x {}'s at every step, a factor the losses' \
             scaling shows; clipping made the applied gradients agree",
            first.right, first.left
        );
    }
    let numbers_part = first.steps.iter().chain([&first.finals]).any(|g| g.verdict == Agreement::Diverged);
    // A loss weight apart: the fact's own measure first, whatever the numbers did.
    if let Some(f) = first.fact {
        let numbers = match numbers_part {
            true => "the gradients part too".to_string(),
            false => format!("every gradient and final weight is within {bound} ({:.2} of it)", first.worst_fraction),
        };
        return format!(
            "NOT EQUIVALENT: each micro-batch's loss reaches {}'s applied gradient weighted {:.4}x {}'s at step {}, \
             {:.1} times what rounding allows that weight (rel {:.1e}); {numbers}",
            first.right, f.ratio, first.left, f.step, f.times, f.allowed
        );
    }
    if first.by_fact && !numbers_part {
        return format!(
            "NOT EQUIVALENT: a recorded fact differs between {} and {} ({}), though every gradient and final \
             weight is within {bound} ({:.2} of it): a difference that rounding or clipping can hide is another \
             training all the same",
            first.left,
            first.right,
            o.diagnosis.as_ref().map_or("see the cause", |d| d.reason.name()),
            first.worst_fraction
        );
    }
    let (what, g) = match first.steps.iter().position(|g| g.verdict == Agreement::Diverged) {
        Some(i) => (format!("step {i}"), &first.steps[i]),
        None if first.finals.verdict == Agreement::Diverged => ("final weights".to_string(), &first.finals),
        None => {
            return format!(
                "NOT EQUIVALENT: {} made {} optimizer steps but {} made {}",
                first.left, first.left_steps, first.right, first.right_steps
            )
        }
    };
    let t = g.tensors.iter().find(|t| t.verdict == Agreement::Diverged).expect("a diverged tensor");
    let detail = t.problem.as_ref().map(ToString::to_string).unwrap_or_else(|| {
        format!(
            "max |Δ| {}, rel {}, {} ulp: {} times the allowed difference ({bound})",
            num(t.max_abs),
            num(t.max_rel),
            ulps(t.max_ulps),
            fraction(t.worst_fraction)
        )
    });
    format!("NOT EQUIVALENT: {} vs {} first differ at {what}, {}: {detail}", first.left, first.right, t.name)
}

/// Why some steps were not judged: float16's range parted the runs there.
pub(crate) fn range_words(p: &crate::judge::RangeParted) -> String {
    let steps: Vec<String> = p.steps.iter().map(usize::to_string).collect();
    let later = match p.from {
        Some(s) => format!(
            "; free-running, the runs then apply different steps, so nothing from step {s} on, final weights included, \
             was judged"
        ),
        None => "; one run applied that step and the other did not, so the final weights were not judged".to_string(),
    };
    format!(
        "; float16's range parted the loss scalers at step {}: a DDP rank's loss share (1/(K/W)) is W times \
         accumulation's (1/K), so its scaled values overflow float16 first and one run skips alone (arithmetic, \
         not a bug){later}; a smaller --init-scale judges every step",
        steps.join(", ")
    )
}

pub(crate) fn num(x: f64) -> String {
    if x == 0.0 {
        "0".into()
    } else {
        format!("{x:.3e}")
    }
}

/// Beyond this many ulps apart, an element equivalent by its bound is one near zero, whose
/// terms' rounding is many of its own ulps: the count alarms and says nothing.
const ULPS_SHOWN: u64 = 1024;

/// The worst element of an equivalent verdict: the allowance it used, and its ulps where
/// they mean something.
fn worst_words(worst: u64, used: f64) -> String {
    if worst <= ULPS_SHOWN {
        return format!("worst: {} ulp, {} of the allowed difference", ulps(worst), fraction(used));
    }
    format!(
        "worst: {} of the allowed difference; up to {} ulp apart near zero, where an ulp is far below the rounding \
         of the terms summed there",
        fraction(used),
        ulps(worst)
    )
}

pub(crate) fn ulps(u: u64) -> String {
    if u == u64::MAX {
        "-".into()
    } else {
        u.to_string()
    }
}

/// Up to 8 values at 4 decimals, as PyTorch prints the article's weights.
pub(crate) fn values(t: &crate::evidence::Values) -> String {
    let shown: Vec<String> = (0..t.numel().min(8)).map(|i| format!("{:.4}", t.get(i) as f32)).collect();
    let more = if t.numel() > 8 { format!(", ... ({} values)", t.numel()) } else { String::new() };
    format!("[{}{more}]", shown.join(", "))
}

/// BatchNorm's running statistics, by the names torch gives them.
fn is_batchnorm_stat(name: &str) -> bool {
    ["running_mean", "running_var", "num_batches_tracked"].iter().any(|s| name.ends_with(s))
}

/// The buffers' section title: "BatchNorm buffers" only where BatchNorm keeps some (a
/// Llama's buffers are its rotary frequencies and masks).
pub(crate) fn buffers_title(b: &GroupDiff) -> &'static str {
    if b.tensors.iter().any(|d| is_batchnorm_stat(&d.name)) {
        "BatchNorm buffers"
    } else {
        "Buffers"
    }
}

/// Why buffers differ between the runs: BatchNorm's, with the counters as evidence; others
/// are the model's own state, equal or not.
pub(crate) fn buffer_explanation(o: &Outcome) -> String {
    let batchnorm = o.runs.buffers.as_ref().is_some_and(|b| buffers_title(b) == "BatchNorm buffers");
    if !batchnorm {
        let differ = o.runs.buffers.as_ref().is_some_and(|b| b.verdict == Agreement::Diverged);
        return if differ {
            "no BatchNorm statistics among them: a buffer that differs is state the model keeps outside its \
             weights and changes as it trains (a cache, a counter); --strict-buffers counts them"
                .into()
        } else {
            "the same in both runs (no BatchNorm statistics among them)".into()
        };
    }
    let count = |p: &crate::evidence::Params| {
        p.iter()
            .find(|(n, _)| n.ends_with("num_batches_tracked"))
            .and_then(|(_, t)| (t.numel() == 1).then(|| t.to_i64()[0]))
    };
    let (a, d) = (count(&o.accumulation.buffers), count(&o.ddp.buffers));
    let counts = match (a, d) {
        (Some(a), Some(d)) => format!(" (num_batches_tracked: accumulation {a}, DDP rank 0 {d})"),
        _ => String::new(),
    };
    format!(
        "expected: DDP (broadcast_buffers=True) copies rank 0's running statistics to every rank before each \
         synchronised forward, so they follow rank 0's micro-batches only, while accumulation updates them on \
         every micro-batch{counts}; gradients and weights do not depend on them in train mode"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::judge::TensorDiff;

    fn buffers(names: &[&str]) -> GroupDiff {
        GroupDiff {
            tensors: names.iter().map(|n| TensorDiff::exact(*n)).collect(),
            max_abs: 0.0,
            max_rel: 0.0,
            max_ulps: 0,
            worst_fraction: 0.0,
            verdict: Agreement::Exact,
            not_judged: None,
        }
    }

    #[test]
    fn ulps_are_shown_where_they_mean_something() {
        assert_eq!(worst_words(82, 0.15), "worst: 82 ulp, 0.15 of the allowed difference");
        let far = worst_words(23_286_649, 0.12);
        assert!(far.starts_with("worst: 0.12 of the allowed difference; up to 23286649 ulp apart near zero"), "{far}");
    }

    #[test]
    fn only_batchnorm_statistics_make_a_batchnorm_section() {
        assert_eq!(buffers_title(&buffers(&["model.rotary_emb.inv_freq"])), "Buffers");
        assert_eq!(buffers_title(&buffers(&["bn1.running_mean", "bn1.num_batches_tracked"])), "BatchNorm buffers");
    }
}
