//! The walk: at the first step whose gradients diverged, each stage in turn from recorded
//! facts, the first that parts named with its numbers, owner and advice in the factor's
//! direction. Silent where a stage's facts were not recorded on both legs (the older rules
//! then speak).

use super::known::lookup;
use super::measure::{engine_accumulates, fit, matched, median, near, Leg};
use super::owner::Owner;
use super::{Located, Stage};
use crate::evidence::{Framework, Trace};
use crate::judge::diagnose::factor::is_whole;
use crate::judge::diagnose::scaling::loss_division;
use crate::judge::diagnose::{Diagnosis, Evidence, Reason};

/// How a located stage went wrong: the known-fixes table's key beside library and stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mechanism {
    DifferentInputs,
    NormaliserPerRank,
    LossDiffers,
    DividedTwice,
    Scaled,
    ApiScaled,
    LocalDiffers,
    Summed,
    DividedAgain,
    LostMicroBatches,
    ZeroedInWindow,
    ScaledInBackward,
    SteppedEarly,
    LostBetweenMarks,
}

#[cfg_attr(not(test), allow(dead_code))]
impl Mechanism {
    const ALL: [Mechanism; 14] = [
        Mechanism::DifferentInputs,
        Mechanism::NormaliserPerRank,
        Mechanism::LossDiffers,
        Mechanism::DividedTwice,
        Mechanism::Scaled,
        Mechanism::ApiScaled,
        Mechanism::LocalDiffers,
        Mechanism::Summed,
        Mechanism::DividedAgain,
        Mechanism::LostMicroBatches,
        Mechanism::ZeroedInWindow,
        Mechanism::ScaledInBackward,
        Mechanism::SteppedEarly,
        Mechanism::LostBetweenMarks,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Mechanism::DifferentInputs => "different inputs",
            Mechanism::NormaliserPerRank => "normaliser per rank",
            Mechanism::LossDiffers => "loss differs",
            Mechanism::DividedTwice => "divided twice",
            Mechanism::Scaled => "scaled",
            Mechanism::ApiScaled => "api scaled",
            Mechanism::LocalDiffers => "local gradient differs",
            Mechanism::Summed => "summed",
            Mechanism::DividedAgain => "divided again",
            Mechanism::LostMicroBatches => "lost micro-batches",
            Mechanism::ZeroedInWindow => "zeroed in window",
            Mechanism::ScaledInBackward => "scaled in backward",
            Mechanism::SteppedEarly => "stepped early",
            Mechanism::LostBetweenMarks => "lost micro-batches between marked boundaries",
        }
    }

    pub fn parse(word: &str) -> Option<Mechanism> {
        Mechanism::ALL.into_iter().find(|m| m.name() == word)
    }
}

/// Relative agreement of two recorded losses of the same inputs and weights.
const LOSS_REL: f64 = 1e-3;
/// Of two factors (scalings, divides), which are ratios of recorded values.
const FACTOR_REL: f64 = 2e-3;

fn located(reason: Reason, stage: Stage, owner: Owner, m: Mechanism, detail: String) -> Option<Diagnosis> {
    let known_fix = lookup(&owner, stage, m.name());
    let mut detail = detail;
    if let Some(f) = known_fix {
        detail += &format!(
            " (known: {} {} to {}: {}; fixed in {}, {})",
            f.library, f.from, f.fixed_in, f.what, f.fixed_in, f.tracker
        );
    }
    Some(Diagnosis { reason, detail, located: Some(Located { stage, owner, known_fix }) })
}

/// The walk's cause where it names a library (a rule among the rules); None where the
/// script owns the stage, which the rules after it word.
pub fn library_at_fault(ev: &Evidence) -> Option<Diagnosis> {
    walk(ev).filter(|d| d.located.as_ref().is_some_and(|l| l.owner.is_library()))
}

/// The walk, in stage order.
pub fn walk(ev: &Evidence) -> Option<Diagnosis> {
    let s = ev.first?;
    let (a, b) = (Leg::at(ev.a, ev.left(), s)?, Leg::at(ev.b, ev.right(), s)?);
    samples(&a, &b, s)
        .or_else(|| loss(&a, &b, s))
        .or_else(|| zeroed(&a, &b, s))
        .or_else(|| scaling_and_reduction(&a, &b, s))
        .or_else(|| local_gradient(&a, &b, s))
}

/// Each parameter's local sum over the ranks at step `s`, undone of the loss's scaling
/// before backward, in both legs; None where either leg lacks them.
fn unscaled_locals(a: &Leg, b: &Leg, s: usize) -> Option<Vec<(String, f64, f64)>> {
    let (sa, sb) = (a.root_scale()?, b.root_scale()?);
    let (la, lb) = (a.local_at(s)?, b.local_at(s)?);
    let out: Vec<_> = la.iter().filter_map(|(n, &x)| Some((n.clone(), x / sa, lb.get(n)? / sb))).collect();
    (!out.is_empty()).then_some(out)
}

/// The first parameter whose unscaled local sums part between the legs.
fn parted(locals: &[(String, f64, f64)]) -> Option<&(String, f64, f64)> {
    let peak = locals.iter().fold(0.0f64, |m, (_, x, _)| m.max(x.abs()));
    locals.iter().find(|(_, x, y)| (x - y).abs() > 1e-3 * peak)
}

/// Scaling inside backward: the local sums' ratio between the legs is not the ratio of the
/// values backward ran on (matched micro-batches' roots), so a backward that a framework ran
/// scaled the gradients itself (a hook of its own), one factor over every parameter. Judged
/// before the roots' scaling, which cannot see it; by the roots themselves, not by what
/// peeling their graphs finds (a normaliser peels in one leg's graph and not the other's).
fn scaled_in_backward(a: &Leg, b: &Leg, s: usize) -> Option<Diagnosis> {
    let (la, lb) = (a.local_at(s)?, b.local_at(s)?);
    let pairs: Vec<(f64, f64)> = la.iter().filter_map(|(n, &x)| Some((*lb.get(n)?, x))).collect();
    let local = fit(&pairs)?;
    let roots = median(matched(a.batches, b.batches).iter().filter_map(|(x, y)| Some(y.root? / x.root?)).collect())?;
    if near(local, roots, FACTOR_REL) {
        return None;
    }
    // The framework whose code ran torch's backward, else the API the loss was handed to.
    let ran = |t: &Trace| t.header.backward_by.filter(|f| *f != Framework::Plain).or(t.header.loss_api);
    let api = ran(b.trace).or(ran(a.trace)).filter(|f| *f != Framework::Plain)?;
    let r = local / roots;
    let t = if ran(b.trace).is_some() { b.trace } else { a.trace };
    let owner = Owner::of_framework(t, api, "its backward's own scaling of the gradients");
    let detail = format!(
        "at step {s} the gradients came out of backward {r:.4}x apart in {} against {}, beyond what the values \
         backward ran on explain (recorded: each parameter's local gradient sum, against the matched micro-batches' \
         roots): {} scaled the gradients inside the backward it ran, differently in each run; the library's, not \
         your script: upgrade {}",
        b.label,
        a.label,
        owner.describe(),
        owner.name()
    );
    located(Reason::LossScaling, Stage::Scaling, owner, Mechanism::ScaledInBackward, detail)
}

/// Local gradient: the same losses, scaled alike, gave other gradients before any reduction
/// (each parameter's local sum over ranks, undone of its scaling).
fn local_gradient(a: &Leg, b: &Leg, s: usize) -> Option<Diagnosis> {
    let locals = unscaled_locals(a, b, s)?;
    let (name, x, y) = parted(&locals)?;
    let detail = format!(
        "the same losses, scaled alike, gave other gradients before any reduction at step {s} (recorded: {name}'s \
         local gradient sum, unscaled, {x:.6e} in {} against {y:.6e} over {}'s ranks): the backward differs between \
         the runs (a parameter frozen or hooked in one run, a gradient changed before the step, a rank's own model)",
        a.label, b.label
    );
    located(Reason::DifferentGradients, Stage::LocalGradient, Owner::Script, Mechanism::LocalDiffers, detail)
}

/// The update's cadence: a framework's optimizer wrapper told to accumulate n micro-batches
/// whose optimizer stepped after fewer.
pub fn cadence(ev: &Evidence) -> Option<Diagnosis> {
    if ev.c.left_steps == ev.c.right_steps {
        return None;
    }
    for (label, t) in [(ev.left(), ev.a), (ev.right(), ev.b)] {
        let (Some(told), Some(micro)) =
            (t.header.framework_accumulation, median(t.facts.micro.iter().map(|&m| m as f64).collect()))
        else {
            continue;
        };
        let calls = median(t.facts.stages.iter().filter_map(|s| s.step_calls).map(|c| c as f64).collect());
        if told as f64 > micro && calls.is_some() {
            let f = t.header.framework.unwrap_or(Framework::Plain);
            let owner = Owner::of_framework(t, f, "its optimizer wrapper's step()");
            if !owner.is_library() {
                continue;
            }
            let detail = format!(
                "{label}'s optimizer stepped after every {micro} backward pass(es), though {} was told to \
                 accumulate {told} micro-batches per step: the script called the wrapper's step() {} time(s) per \
                 optimizer step and the wrapper let each one through. The library's step gating is at fault, not \
                 your loop (calling step() every micro-batch under its accumulation is its documented use): \
                 upgrade {}",
                owner.describe(),
                calls.unwrap_or(1.0),
                owner.name()
            );
            return located(Reason::StepCount, Stage::Update, owner, Mechanism::SteppedEarly, detail);
        }
    }
    None
}

/// Samples: the micro-batches' inputs, as multisets over the step.
fn samples(a: &Leg, b: &Leg, s: usize) -> Option<Diagnosis> {
    let (fa, fb) = (a.fingerprints()?, b.fingerprints()?);
    if fa == fb {
        return None;
    }
    let missing =
        b.batches.iter().enumerate().find(|(_, x)| x.fingerprint.is_some_and(|f| fa.binary_search(&f).is_err()));
    let which = match missing {
        Some((i, x)) => {
            let nth = b.batches[..i].iter().filter(|y| y.rank == x.rank).count() + 1;
            format!("{}'s rank {} micro-batch {nth} saw inputs no micro-batch of {} saw", b.label, x.rank, a.label)
        }
        None => format!("{} and {} saw different numbers of micro-batches", a.label, b.label),
    };
    let (owner, by) = dealer(b.trace);
    let detail = format!(
        "the runs see different samples at step {s} (recorded: {which}; {} of {} micro-batches differ): {}",
        fb.iter().filter(|f| fa.binary_search(f).is_err()).count(),
        fb.len(),
        by
    );
    located(Reason::DifferentSamples, Stage::Samples, owner, Mechanism::DifferentInputs, detail)
}

/// Who dealt the samples: a framework that shards the data loader, else the script.
pub fn dealer(t: &Trace) -> (Owner, String) {
    match t
        .header
        .framework
        .filter(|f| matches!(f, Framework::Transformers | Framework::Accelerate | Framework::Lightning))
    {
        Some(f) => {
            let o = Owner::of_framework(t, f, "its sharding of the data loader");
            let by = format!(
                "{} deals the batches to the ranks; check its drop_last/even_batches settings against the \
                 accumulation run's order",
                o.describe()
            );
            (o, by)
        }
        None => (
            Owner::Script,
            "each rank must see the accumulation run's micro-batches of that step (strided vs contiguous split, \
             padding, the sampler's seed and epoch)"
                .into(),
        ),
    }
}

/// Gradients zeroed inside a window: the micro-batches before it never reach the step.
fn zeroed(a: &Leg, b: &Leg, s: usize) -> Option<Diagnosis> {
    let (leg, n) = [a, b].into_iter().find_map(|l| {
        let n = l.trace.facts.stages.get(s).map_or(0, |st| st.zeroed);
        (n > 0).then_some((l, n))
    })?;
    let by = leg.trace.header.zeroed_by.unwrap_or(Framework::Plain);
    let owner = Owner::of_framework(leg.trace, by, "zero_grad inside the accumulation window");
    let advice = match owner.is_library() {
        true => format!(
            "{} zeroed them, not your script (which leaves the window to it): upgrade {}",
            owner.describe(),
            owner.name()
        ),
        false => "your loop zeroes them: call zero_grad() only after optimizer.step(), once per K micro-batches".into(),
    };
    let detail = format!(
        "at step {s} {}'s gradients were zeroed {n} time(s) after a backward and before the optimizer step (recorded): \
         the micro-batches before each zeroing never reach the step; {advice}",
        leg.label
    );
    located(Reason::ZeroedInWindow, Stage::LocalGradient, owner, Mechanism::ZeroedInWindow, detail)
}

/// Loss: the same inputs gave different losses.
fn loss(a: &Leg, b: &Leg, s: usize) -> Option<Diagnosis> {
    let pairs = matched(a.batches, b.batches);
    let (x, y) = pairs.iter().find(|(x, y)| match (x.loss(), y.loss()) {
        (Some(l), Some(m)) => !near(l, m, LOSS_REL),
        _ => false,
    })?;
    let (lx, ly) = (x.loss()?, y.loss()?);
    if let (Some(nx), Some(ny)) = (x.normaliser, y.normaliser) {
        if !near(nx, ny, 1e-9) {
            let t = b.trace;
            let by = t.header.normalised_by.unwrap_or(Framework::Plain);
            let owner = Owner::of_framework(t, by, "the num_items_in_batch it passes the model's loss");
            let advice = match owner.is_library() {
                true => format!(
                    "{} counts the normaliser on each rank alone; this is the library's, not your script's: \
                     upgrade it, or where it has the setting, count tokens across ranks \
                     (Transformers: TrainingArguments(average_tokens_across_devices=True))",
                    owner.describe()
                ),
                false => "your script passes each rank its own count: all-reduce the count over the ranks and \
                          multiply the loss by W before backward (DDP averages)"
                    .into(),
            };
            let detail = format!(
                "the same inputs gave different losses at step {s}: {} {lx:.6} with num_items_in_batch={nx} \
                 against {}'s rank {} {ly:.6} with num_items_in_batch={ny}: each micro-batch's loss is divided by a \
                 different token count; {advice}",
                a.label, b.label, y.rank
            );
            return located(Reason::TokenCountPerRank, Stage::Loss, owner, Mechanism::NormaliserPerRank, detail);
        }
    }
    // One ratio for every micro-batch is a scaling inside the forward (a framework making up
    // for the ranks' averaging), judged with the scaling.
    let ratios: Vec<f64> = pairs.iter().filter_map(|(x, y)| Some(y.loss()? / x.loss()?)).collect();
    if ratios.iter().all(|r| near(*r, ratios[0], LOSS_REL)) {
        return None;
    }
    let detail = format!(
        "the same inputs gave different losses at step {s} ({} {lx:.6}, {}'s rank {} {ly:.6}) from the same \
         weights: the forward differs between the runs (a rank's own model state, dropout, or a loss computed \
         from other than the inputs)",
        a.label, b.label, y.rank
    );
    located(Reason::DifferentGradients, Stage::Loss, Owner::Script, Mechanism::LossDiffers, detail)
}

/// Scaling before backward and the reduction, judged together: each micro-batch's loss
/// reaches the applied gradient multiplied by scaling / divide, which both legs must share.
fn scaling_and_reduction(a: &Leg, b: &Leg, s: usize) -> Option<Diagnosis> {
    let (sa, sb) = (a.scaling()?, b.scaling()?);
    let (da, db) = (a.divide(), b.divide());
    // A reduction that does not average (measured) is the engine's, whatever the scaling;
    // one process has none, unless an engine accumulates for it (DeepSpeed's).
    for (leg, d) in [(b, db), (a, da)] {
        let w = leg.world as f64;
        if d.is_some_and(|d| (leg.world > 1 || engine_accumulates(leg.trace)) && !near(d, w, FACTOR_REL)) {
            return reduction(leg, d?, s);
        }
    }
    // No divide fits: an engine's own accumulation lost micro-batches (one process first:
    // there nothing is reduced, so the ranks' reduction is judged against a sound one).
    for (leg, d) in [(a, da), (b, db)] {
        if d.is_none() && engine_accumulates(leg.trace) && leg.has_local() {
            return not_averaged(leg, s);
        }
    }
    if let Some(d) = scaled_in_backward(a, b, s) {
        return Some(d);
    }
    let (da, db) = (da.unwrap_or(1.0), db.unwrap_or(b.world as f64));
    // Each matched micro-batch's root reaches the applied gradient divided by the reduction.
    let ratio = median(
        matched(a.batches, b.batches).iter().filter_map(|(x, y)| Some((y.root? / db) / (x.root? / da))).collect(),
    )?;
    if near(ratio, 1.0, FACTOR_REL) {
        return None;
    }
    scaling(a, b, (sa, sb), ratio, s)
}

/// Whose code reduces a run's gradients: its engine's library, DeepSpeed where the loss went
/// through its engine.backward in one process (no engine named), else torch's DDP.
fn reducer(t: &Trace) -> Owner {
    match (t.header.engine, t.header.loss_api) {
        (None, Some(Framework::DeepSpeed)) => {
            Owner::library(t, "deepspeed", "ZeRO's gradient accumulation and reduction")
        }
        (e, _) => Owner::of_engine(t, e),
    }
}

/// The engine's own accumulation left a gradient that is no divide of the local ones.
fn not_averaged(leg: &Leg, s: usize) -> Option<Diagnosis> {
    let t = leg.trace;
    let owner = reducer(t);
    // Boundaries marked by hand (set_gradient_accumulation_boundary): several backwards per
    // engine step are the engine's documented use, whatever its accumulation setting.
    let (m, marked) = match t.header.boundary_by {
        Some(by) => (
            Mechanism::LostBetweenMarks,
            format!(
                " between the accumulation boundaries {} marked by hand (set_gradient_accumulation_boundary, \
                 the engine's documented way to run several backwards per step)",
                if by == Framework::Plain { "your script" } else { by.name() }
            ),
        ),
        None => (Mechanism::LostMicroBatches, String::new()),
    };
    let detail = format!(
        "from step {s} the gradient {}'s optimizer applied is no multiple of the local gradients its backward \
         passes made (recorded: each parameter's local gradient sum before the engine took it, against the applied \
         gradient's): {} lost or changed micro-batches while accumulating them{marked}; the library's, not your \
         script: upgrade {}",
        leg.label,
        owner.describe(),
        owner.name()
    );
    // Over several ranks the applied gradient is the reduction's; in one process, the
    // accumulation's alone.
    let stage = if leg.world > 1 { Stage::Reduction } else { Stage::LocalGradient };
    located(Reason::DifferentGradients, stage, owner, m, detail)
}

fn reduction(leg: &Leg, d: f64, s: usize) -> Option<Diagnosis> {
    let t = leg.trace;
    let w = leg.world as f64;
    let owner = reducer(t);
    let (m, what) = match d < w {
        true => (
            Mechanism::Summed,
            format!(
                "{}: the applied gradients are {:.2}x too large",
                if near(d, 1.0, FACTOR_REL) {
                    "summed them instead of averaging"
                } else {
                    "divided them by less than the ranks"
                },
                w / d
            ),
        ),
        false => (
            Mechanism::DividedAgain,
            format!(
                "divided them by {:.2} more than averaging does: the applied gradients are {:.2}x too small",
                d / w,
                d / w
            ),
        ),
    };
    let detail = format!(
        "at step {s} {}'s reduction divided the {} ranks' local gradients by {d:.2} where averaging divides by \
         {w} (recorded: each parameter's local gradient before the reduction, summed over ranks, against the \
         gradient the optimizer applied); {} {what}. The loss scaling before backward matches the other run, so \
         this is the library's reduction, not your script: upgrade {} (or average yourself only where its docs \
         say so)",
        leg.label,
        leg.world,
        owner.describe(),
        owner.name()
    );
    located(Reason::SummedOverRanks, Stage::Reduction, owner, m, detail)
}

/// The loss was scaled differently before backward: which leg, by whom, and which way.
fn scaling(a: &Leg, b: &Leg, (sa, sb): (f64, f64), ratio: f64, s: usize) -> Option<Diagnosis> {
    // What a leg's scaling should be: 1/k (a mean per micro-batch, k per rank), or where the
    // forward was passed a normaliser over the window (Trainer's num_items_in_batch) none, or
    // W on each of W ranks (making up for the ranks' averaging).
    let expected = |l: &Leg| match l.batches.iter().any(|x| x.normaliser.is_some()) {
        true => l.world as f64,
        false => 1.0 / l.per_rank(),
    };
    let (dev_a, dev_b) = (sa / expected(a), sb / expected(b));
    let (leg, sc, dev) = if dev_a.ln().abs() > dev_b.ln().abs() { (a, sa, dev_a) } else { (b, sb, dev_b) };
    let t = leg.trace;
    let k = leg.per_rank();
    let direction = match ratio > 1.0 {
        true => format!("{}'s gradients are {ratio:.2}x {}'s", b.label, a.label),
        false => format!("{}'s gradients are {:.2}x smaller than {}'s", b.label, 1.0 / ratio, a.label),
    };
    let handed_by = t.header.loss_handed_by.unwrap_or(Framework::Plain);
    // Divided too much (a division on top of a framework's, or by K on every rank), or not
    // enough (a loss never divided): opposite advice.
    let too_much = dev < 1.0;
    let normalised = leg.batches.iter().any(|x| x.normaliser.is_some());
    let (owner, m, advice) = match (leg.split(), t.header.loss_api) {
        // A loss normalised over the window (num_items_in_batch) handed to an API that divides
        // by its accumulation steps again: whoever handed it over owns both halves.
        (Some((_, by_api)), Some(api)) if normalised && too_much && !near(by_api, 1.0, FACTOR_REL) => {
            let owner =
                Owner::of_framework(t, handed_by, "its hand-over of a normalised loss to a backward that divides");
            let how = loss_division(api).unwrap_or("the framework's backward");
            let advice = match owner.is_library() {
                true => format!(
                    "{} normalised each loss over the window (num_items_in_batch) and handed it to {how}, which \
                     divided it by {:.4} again; the library's, not your script: upgrade {}",
                    owner.describe(),
                    by_api,
                    owner.name()
                ),
                false => format!(
                    "your script hands a loss already normalised over the window (num_items_in_batch) to {how}, \
                     which divides it by {by_api:.4} again: tell the backward not to divide (scale_wrt_gas=False) or \
                     hand it the per-micro-batch mean"
                ),
            };
            (owner, Mechanism::DividedTwice, advice)
        }
        (Some((pre, by_api)), Some(api))
            if !near(pre, 1.0, FACTOR_REL) && !near(by_api, 1.0, FACTOR_REL) && too_much =>
        {
            // Who divided before the API is not recorded (a framework's loop may run the
            // script's override): the script's, as its code returns the loss.
            let how = loss_division(api).unwrap_or("the framework's backward");
            let advice = format!(
                "the loss was divided twice, by {pre:.4} before the backward API and by {by_api:.4} inside it: {how} \
                 already divides each loss by the accumulation steps, so a loss divided by K in your own step is \
                 divided twice: return the plain mean loss"
            );
            (Owner::Script, Mechanism::DividedTwice, advice)
        }
        (Some((pre, by_api)), Some(api)) if near(pre, 1.0, FACTOR_REL) && !near(by_api, 1.0, FACTOR_REL) => {
            let owner = Owner::of_framework(t, api, "its backward's division of the loss");
            match t.header.framework_accumulation {
                Some(n) if near(by_api, 1.0 / n as f64, FACTOR_REL) => (
                    Owner::Script,
                    Mechanism::Scaled,
                    format!(
                        "{} divided each loss by the {n} micro-batches it was told to accumulate, but each process \
                         runs {k} per step: tell it the micro-batches per process (K/W under DDP, K alone)",
                        owner.describe()
                    ),
                ),
                _ => {
                    let advice = format!(
                        "{} scaled each loss by {by_api:.4} where 1/{k} averages the micro-batches each process runs: \
                         the library's scaling, not your script: upgrade {}",
                        owner.describe(),
                        owner.name()
                    );
                    (owner, Mechanism::ApiScaled, advice)
                }
            }
        }
        _ => {
            let advice = match (too_much, loss_division(handed_by)) {
                (true, Some(how)) => format!(
                    "{} scales each loss by {sc:.4}: {how} already divides each loss by the accumulation steps, so a \
                     loss divided by K in your own step is divided twice: return the plain mean loss",
                    leg.label
                ),
                (true, None) => format!(
                    "{} divides each loss by {:.2} where the {k} micro-batches each of its processes runs need {k}: \
                     divide by the micro-batches per process (K in accumulation, K/W on each rank), not by K on every \
                     rank",
                    leg.label,
                    1.0 / sc
                ),
                (false, _) => format!(
                    "{} scales each loss by {sc:.4}, {:.2}x what its {k} micro-batches per process need: divide each \
                     micro-batch's loss by the micro-batches each process runs (K in accumulation, K/W on each rank)",
                    leg.label, dev
                ),
            };
            (Owner::Script, Mechanism::Scaled, advice)
        }
    };
    let reason = if is_whole(ratio, FACTOR_REL) { Reason::LossScaling } else { Reason::UniformFactor };
    let detail = format!(
        "{direction} from step {s}: the same losses were scaled differently before backward (recorded: {} \
         multiplied each loss by {sa:.4}, {} by {sb:.4}); {advice}",
        a.label, b.label
    );
    located(reason, Stage::Scaling, owner, m, detail)
}

/// The owner of a rule's cause: the script, but for ranks that part under an engine whose
/// reduction no script controls (DeepSpeed's ZeRO reduces inside its own backward and step).
pub fn rule_owner(ev: &Evidence, reason: Reason) -> Owner {
    if matches!(reason, Reason::RanksDiffer | Reason::UnsyncedGradient) {
        for t in [ev.b, ev.a] {
            if engine_accumulates(t) && t.header.world_size.unwrap_or(1) > 1 {
                return reducer(t);
            }
        }
    }
    Owner::Script
}
