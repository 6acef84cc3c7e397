//! One case through every run and its classification: fine, a failure, a bug caught or
//! missed, a false alarm, or counted apart (blew up, nothing judged, no verdict).

use std::time::Instant;

use super::Timing;
use crate::error::Result;
use crate::jobs::pool::RankPool;
use crate::judge::{diagnose, Comparer, Context, Diagnosis, Verdict};
use crate::plan::Effect;
use crate::spec::{Bug, ToleranceOverrides, TrainConfig};
use crate::train::accumulation;

pub(super) struct Case {
    pub(super) verdict: Verdict,
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
        let platform = crate::dist::kernels::apply(self.kernels, cfg.device)?;
        if crate::train::repeat_check(cfg, platform)?.is_some() {
            let (verdict, used, diagnosis, unjudged) = (Verdict::Exact, 0.0, None, false);
            return Ok(Case { verdict, used, diagnosis, unjudged, no_verdict: true });
        }
        let (acc, ddp) = self.pool.lead(cfg)?;
        let t1 = Instant::now();
        let (acc, big) = match acc {
            Some(acc) => acc,
            None => (accumulation(cfg)?, cfg.with_big_batch().then(|| crate::train::big_batch(cfg)).transpose()?),
        };
        let t2 = Instant::now();
        let tol = self.tol.tolerance(cfg.dtype, cfg.lockstep);
        let derive = self.tol.derive(cfg);
        let c = Comparer::new("accumulation", "ddp", &tol, None).derived(derive).finish(&acc, &ddp, false);
        let cx = Context::of_run(cfg);
        let mut diagnosis = diagnose(&acc, &ddp, &c, &cx);
        let (mut verdict, mut used) = (c.verdict, c.worst_fraction);
        let unjudged = c.verdict != Verdict::Diverged && c.steps.iter().all(|g| g.not_judged.is_some());
        if let Some(big) = big {
            // The same judgement a verification makes (`Trace::for_big_batch`).
            let acc = acc.for_big_batch();
            let b = Comparer::new("accumulation", "big batch", &tol, None).derived(derive).finish(&acc, &big, true);
            let runs_agree = c.verdict != Verdict::Diverged;
            if diagnosis.is_none() {
                diagnosis = crate::judge::diagnose_big_batch(&acc, &big, &b, &cx, runs_agree);
            }
            (verdict, used) = (verdict.max(b.verdict), used.max(b.worst_fraction));
        }
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
    let diverged = case.verdict == Verdict::Diverged;
    let blew_up = case.diagnosis.as_ref().is_some_and(|d| d.reason == crate::judge::Reason::NonFinite);
    if case.no_verdict {
        return Finding::NoVerdict;
    }
    if case.unjudged && case.verdict != Verdict::Diverged {
        return Finding::Unjudged;
    }
    match bug {
        None if diverged && blew_up => Finding::BlewUp,
        None if diverged => Finding::Failure,
        None => Finding::Fine,
        Some(b) => match (b.effect(cfg), diverged) {
            (Effect::Math, true) => Finding::Caught,
            (Effect::Math, false) => Finding::Missed,
            (Effect::None, true) => Finding::FalseAlarm,
            (Effect::None, false) => Finding::Fine,
            (Effect::Order, _) => Finding::Reordered,
        },
    }
}
