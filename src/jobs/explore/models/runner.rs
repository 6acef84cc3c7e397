//! One case through every run and its classification: fine, a failure, a bug caught or
//! missed, a false alarm, or counted apart (blew up, nothing judged, no verdict).

use std::time::Instant;

use super::Timing;
use crate::error::Result;
use crate::jobs::pool::RankPool;
use crate::judge::{Agreement, Diagnosis};
use crate::plan::Effect;
use crate::spec::{Bug, Config, ToleranceOverrides, TrainConfig};
use crate::train::accumulation;

pub(super) struct Case {
    pub(super) verdict: Agreement,
    /// The worst difference over what it was allowed.
    pub(super) used: f64,
    pub(super) diagnosis: Option<Diagnosis>,
    /// No step was judged: the loss scalers skipped every one, or float16's range parted
    /// the runs (`judge::NotJudged`).
    pub(super) unjudged: bool,
    /// The kernels did not repeat themselves: nothing was run.
    pub(super) no_verdict: bool,
}

pub(super) struct Runner<'a> {
    pub(super) pool: &'a RankPool,
    pub(super) kernels: crate::spec::KernelMode,
    pub(super) tol: ToleranceOverrides,
    pub(super) timing: Timing,
}

impl Runner<'_> {
    pub(super) fn evaluate(&mut self, cfg: &TrainConfig) -> Result<Case> {
        let t0 = Instant::now();
        let platform = crate::dist::kernels::apply(self.kernels, cfg.run.device)?;
        if crate::train::repeat_check(cfg, platform)?.is_some() {
            let (verdict, used, diagnosis, unjudged) = (Agreement::Exact, 0.0, None, false);
            return Ok(Case { verdict, used, diagnosis, unjudged, no_verdict: true });
        }
        let (acc, ddp) = self.pool.lead(cfg)?;
        let t1 = Instant::now();
        let (acc, big) = match acc {
            Some(acc) => acc,
            None => (accumulation(cfg)?, cfg.with_big_batch().then(|| crate::train::big_batch(cfg)).transpose()?),
        };
        let t2 = Instant::now();
        // The judgement a verification makes, big batch included.
        let judged = Config::judging(
            cfg.clone(),
            self.tol.tolerance(cfg.precision.dtype, cfg.run.lockstep),
            self.tol.derive(cfg),
        );
        let o = crate::jobs::verify::assemble(&judged, acc, ddp, big, None);
        let used = o.comparisons().iter().map(|c| c.worst_fraction).fold(0.0, f64::max);
        let unjudged = o.runs.verdict != Agreement::Diverged && o.runs.steps.iter().all(|g| g.not_judged.is_some());
        let diagnosis = o.diagnosis.clone().or_else(|| o.big_batch.as_ref().and_then(|b| b.diagnosis.clone()));
        let verdict = o.agreement();
        let t = &mut self.timing;
        t.ddp += (t1 - t0).as_secs_f64();
        t.accumulation += (t2 - t1).as_secs_f64();
        t.compare += t2.elapsed().as_secs_f64();
        t.evaluations += 1;
        Ok(Case { verdict, used, diagnosis, unjudged, no_verdict: false })
    }
}

/// How a case came out relative to what it should have.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Finding {
    Fine,
    /// Honest run not equivalent: a real finding.
    Failure,
    /// The bug changed the math and the gate fired.
    Caught,
    /// The bug changed the math and the gate stayed quiet.
    Missed,
    /// The bug cannot change the math yet the gate fired.
    FalseAlarm,
    /// The bug reorders the same sums: rounding alone, counted neither way.
    Reordered,
    /// Nothing was judged (every step skipped or parted by float16's range): neither way.
    Unjudged,
    /// An honest draw whose training blew up: a bad draw, not a verdict on the gate.
    BlewUp,
    /// The kernels did not repeat themselves: no verdict either way.
    NoVerdict,
}

pub(super) fn classify(bug: Option<Bug>, cfg: &TrainConfig, case: &Case) -> Finding {
    let diverged = case.verdict == Agreement::Diverged;
    let blew_up = case.diagnosis.as_ref().is_some_and(|d| d.reason == crate::judge::Reason::NonFinite);
    if case.no_verdict {
        return Finding::NoVerdict;
    }
    if case.unjudged && case.verdict != Agreement::Diverged {
        return Finding::Unjudged;
    }
    match bug {
        None if diverged && blew_up => Finding::BlewUp,
        None if diverged => Finding::Failure,
        None => Finding::Fine,
        Some(b) => match (crate::plan::bugs::effect(b, cfg), diverged) {
            (Effect::Math, true) => Finding::Caught,
            (Effect::Math, false) => Finding::Missed,
            (Effect::None, true) => Finding::FalseAlarm,
            (Effect::None, false) => Finding::Fine,
            (Effect::Order, _) => Finding::Reordered,
        },
    }
}
