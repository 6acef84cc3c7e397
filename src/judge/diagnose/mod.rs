//! One path from facts to a culprit: locate → own → advise → annotate.
//!
//! - *Locate* (`locate/`): a `Source` hands the pipeline partings, tier by tier
//!   (`source::Tier`, strongest first): recorded facts of what ran and of the ranks'
//!   synchronisation, a stage the walk located in a library's code, the recorded facts of
//!   the loss and the update, what rounding explains, a stage the walk located in the
//!   script, then the shape of the first differing step. A parting is facts only: step,
//!   stage, mechanism, leg, numbers (`parting`).
//! - *Own* (`own`): the owner, from the facts of the leg the parting points at: one rule per
//!   mechanism, whichever locator found it.
//! - *Advise* (`advise/`): the one place the words are written, aimed by the facts.
//! - *Annotate* (`annotate`): a known upstream fix for a located library's version.
//!
//! Two legs compared are one source (`Evidence`); one run judged by its stages' contracts
//! plugs in as another.

mod advise;
mod annotate;
mod context;
mod evidence;
mod locate;
mod measure;
mod own;
mod owner;
mod parting;
mod source;
mod words;

use serde::Serialize;

pub use annotate::KnownFix;
pub use context::{Context, Loss, Origin, ShortWindow};
pub use evidence::{Evidence, Pair};
pub use measure::{most_apart, scales_inside};
pub use owner::Owner;
pub use parting::{ControlPath, Numbers, Parting};
pub use source::{Source, Tier, Words};
pub use words::{Reason, Stage};

use super::{Agreement, Comparison};
use crate::evidence::Trace;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Diagnosis {
    /// Short and stable, for counting by reason.
    pub reason: Reason,
    pub detail: String,
    /// The stage where the runs part and its owner (`stage`, `owner`, `known_fix` in a
    /// report), for users' recorded runs.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub located: Option<Located>,
    /// The tier that named it (None: a caution): whether a recorded fact decided, or only
    /// what the numbers suggest (`judge::control` asks).
    #[serde(skip)]
    pub tier: Option<Tier>,
    /// The step the cause shows at, where one does (None: the whole run).
    #[serde(skip)]
    pub step: Option<usize>,
}

impl Diagnosis {
    /// The located stage and owner in words ("the reduction stage, owned by torch 2.8.0
    /// (FSDP2's reduce-scatter)"), where located.
    pub fn where_(&self) -> Option<String> {
        let l = self.located.as_ref()?;
        Some(format!("the {} stage, owned by {}", l.stage.name(), l.owner.describe()))
    }
}

/// A located cause: the stage, whose code owns it, and a known upstream fix where the table
/// has one for that library, version, stage and mechanism.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Located {
    pub stage: Stage,
    pub owner: Owner,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub known_fix: Option<&'static KnownFix>,
}

impl Tier {
    /// A stage the walk located speaks early where a library's code owns it, and after the
    /// recorded facts of the update and what rounding explains where the script owns it.
    fn keeps(self, owner: &Owner) -> bool {
        match self {
            Tier::LibraryStage => owner.is_library(),
            Tier::ScriptStage => !owner.is_library(),
            _ => true,
        }
    }
}

/// The pipeline: the strongest parting `src` locates, owned, advised and annotated; None
/// where nothing parts. `locates`: the cause carries its stage and owner (users' recorded
/// runs; ours name their flags instead).
pub fn name(src: &dyn Source, locates: bool) -> Option<Diagnosis> {
    let (tier, parting, owner) = Tier::ALL.into_iter().find_map(|tier| {
        let p = src.locate(tier)?;
        let owner = own::own(&p, src);
        tier.keeps(&owner).then_some((tier, p, owner))
    })?;
    Some(Diagnosis { tier: Some(tier), ..said(&parting, owner, &src.words(), locates) })
}

/// `p` said as the cause in place of what the pipeline named, at `tier` (the control run
/// found a difference the pipeline could only guess at, or none could be proven rounding).
pub fn restated(p: &Parting, src: &dyn Source, tier: Tier) -> Diagnosis {
    let owner = own::own(p, src);
    Diagnosis { tier: Some(tier), ..said(p, owner, &src.words(), true) }
}

fn said(p: &Parting, owner: Owner, w: &Words, locates: bool) -> Diagnosis {
    let known_fix = annotate::known_fix(p, &owner);
    let mut detail = advise::advice(p, &owner, w);
    if let Some(f) = known_fix {
        detail += &advise::known(f);
    }
    let located = match locates {
        true => p.stage.map(|stage| Located { stage, owner, known_fix }),
        false => None,
    };
    Diagnosis { reason: p.reason(), detail, located, tier: None, step: p.step }
}

/// One run judged by its stages' contracts, step by step (`ddp-verify watch`): the first
/// step that breaks one, named by the pipeline as two runs' partings are; None where every
/// contract held. `c`: the run against itself (what the locators that read a comparison
/// read: the ranks' drift).
pub fn contracts(t: &Trace, c: &Comparison) -> Option<Diagnosis> {
    let cx = Context::of_traces(t, t);
    let steps = t.facts.stages.len().max(t.steps.len()).max(1);
    (0..steps).find_map(|s| {
        let mut ev = Evidence::new(t, t, c, &cx, Pair::OneRun);
        ev.first = Some(s);
        name(&ev, true)
    })
}

/// The likely cause of a divergence between accumulation `a` and DDP `b`; None where they
/// agree.
pub fn diagnose(a: &Trace, b: &Trace, c: &Comparison, cx: &Context) -> Option<Diagnosis> {
    if c.verdict != Agreement::Diverged {
        return None;
    }
    let ev = Evidence::new(a, b, c, cx, Pair::Runs);
    let d = name(&ev, !cx.ours())?;
    // Another optimizer's gradients apart under final weights alike bit for bit: what the
    // numbers only suggest (a shape, rounding) yields to the doubt about when they were
    // recorded (a trace that took them at the recorded optimizer's step, before the script
    // reduced them for their own).
    let guessed = d.tier.is_some_and(|t| t >= Tier::Rounding && t != Tier::ScriptStage);
    if !cx.ours() && guessed && recording_in_doubt(c) {
        let (first, tensors) = most_apart(c);
        let p = Parting::new(first, None, None, Numbers::Unexplained { tensors, control: None, finals_exact: true });
        return Some(restated(&p, &ev, Tier::Shape));
    }
    Some(d)
}

/// Accumulation `a` against one big batch `b`. `runs_agree`: accumulation and DDP were found
/// equivalent, so a mismatch here is a mistake both make alike, asked first; otherwise, and
/// where none of those speaks, what judges accumulation against DDP (chaos aside: one process
/// against one process).
pub fn big_batch(a: &Trace, b: &Trace, c: &Comparison, cx: &Context, runs_agree: bool) -> Option<Diagnosis> {
    if c.verdict != Agreement::Diverged {
        return None;
    }
    let cx = Context { chaos_possible: false, ..*cx };
    let mut ev = Evidence::new(a, b, c, &cx, Pair::BigBatch { shared: false });
    let shared = c.left_steps == c.right_steps && runs_agree && ev.grads().is_some();
    ev.pair = Pair::BigBatch { shared };
    name(&ev, !cx.ours())
}

/// A factor clipping hid at every step that the stage facts show in the losses' scaling
/// before backward or in the reduction (a loss never divided, say): a recorded fact that
/// differs, so it decides the verdict (the runs part once the norm falls under max_norm) and
/// is the cause, with the factor, ahead of what rounding may explain. None for our own runs,
/// and where the facts do not show it (then it stays a caution).
pub fn hidden_by_clipping(a: &Trace, b: &Trace, c: &Comparison, cx: &Context) -> Option<(f64, Diagnosis)> {
    if cx.ours() {
        return None;
    }
    let mut ev = Evidence::new(a, b, c, cx, Pair::Runs);
    let Numbers::HiddenFactor { ratio, .. } = locate::hidden_factor(&ev)?.numbers else { return None };
    ev.first = Some(0);
    let p = locate::scaling_at(&ev, 0)?;
    let shown = match p.numbers {
        Numbers::Scaling { ratio: r, .. } => measure::near(r, ratio, 1e-2),
        Numbers::Reduction { divide, world, .. } => measure::near(world as f64 / divide, ratio, 1e-2),
        _ => false,
    };
    if !shown {
        return None;
    }
    let mut d = restated(&p, &ev, Tier::Recorded);
    d.detail = format!(
        "clipping hid it: every step's gradients were clipped to the same norm, so the runs agree only while \
         clipping is active; {}",
        d.detail
    );
    Some((ratio, d))
}

/// A recorded fact apart where the numbers agree: the legs' precisions, or at some step a
/// micro-batch's loss (step 0) or its weight in the applied gradient (`locate::facts_at`).
/// Facts decide before numbers: a small bug (a loss off by 3% on the ranks) hides under a
/// low precision's allowance, or under clipping, but not from its fact. None for our own
/// runs.
pub fn facts_apart(a: &Trace, b: &Trace, c: &Comparison, cx: &Context) -> Option<(Diagnosis, Option<FactApart>)> {
    if cx.ours() {
        return None;
    }
    let mut ev = Evidence::new(a, b, c, cx, Pair::Runs);
    if let Some(p) = locate::precision_apart(&ev) {
        return Some((restated(&p, &ev, Tier::Recorded), None));
    }
    let steps = a.facts.stages.len().min(b.facts.stages.len());
    (0..steps).find_map(|s| {
        ev.first = Some(s);
        let p = locate::ranks_precision_apart(&ev).or_else(|| locate::facts_at(&ev, s))?;
        let measured = match p.numbers {
            Numbers::Scaling { ratio, .. } => {
                locate::weight_rel(&ev, s).map(|allowed| FactApart::new(s, ratio, allowed))
            }
            _ => None,
        };
        Some((restated(&p, &ev, Tier::Recorded), measured))
    })
}

/// Another optimizer's gradients (`optimizer{k}.*`) among those a step parts most, while
/// every final weight agrees bit for bit: the gradients' recording moment, not the
/// training, is in doubt.
pub fn recording_in_doubt(c: &Comparison) -> bool {
    let (first, tensors) = most_apart(c);
    let other = |n: &str| n.strip_prefix("optimizer").is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()));
    let exact =
        !c.finals.tensors.is_empty() && c.finals.tensors.iter().all(|t| t.max_abs == 0.0 && t.problem.is_none());
    first.is_some() && exact && tensors.iter().any(|(n, _)| other(n))
}

/// A loss weight apart between the legs, measured against what rounding allows it: the
/// number a verdict decided by that fact is.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct FactApart {
    pub step: usize,
    /// The right leg's weight of each micro-batch's loss in the applied gradient, over the
    /// left's.
    pub ratio: f64,
    /// How far that ratio may part from 1 by rounding alone (relative).
    pub allowed: f64,
    /// |ratio - 1| over `allowed`.
    pub times: f64,
}

impl FactApart {
    fn new(step: usize, ratio: f64, allowed: f64) -> Self {
        FactApart { step, ratio, allowed, times: (ratio - 1.0).abs() / allowed.max(f64::MIN_POSITIVE) }
    }
}

/// The caution beside an equivalence where both runs clipped every step by a steady factor.
pub fn caution(a: &Trace, b: &Trace, c: &Comparison, cx: &Context) -> Option<Diagnosis> {
    if c.verdict == Agreement::Diverged {
        return None;
    }
    let ev = Evidence::new(a, b, c, cx, Pair::Runs);
    let p = locate::hidden_factor(&ev)?;
    Some(said(&p, Owner::Script, &ev.words(), false))
}

/// A caution the judgement found itself (needless synchronisation, rounding amplified, short
/// batches against the big batch), in words; no stage: the runs agree.
pub fn cautioned(p: &Parting, left: &str, right: &str) -> Diagnosis {
    let w = Words { left, right, ours: false, framework: None };
    said(p, Owner::Script, &w, false)
}

#[cfg(test)]
mod contract_tests;
#[cfg(test)]
mod stack_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod walk_tests;
