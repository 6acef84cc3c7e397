//! The one judgement on made-up legs: both paths alike, facts before numbers, controls.

use super::*;
use crate::evidence::{Engine, RunKind, TraceHeader, Values};
use crate::judge::Reason;
use crate::spec::TrainConfig;

/// A user's runs that agree at step 0 and part later with no recorded fact apart: NOT
/// EQUIVALENT until a control run measures rounding's reach (the nudge asked for is step
/// 0's distance, at least an epsilon); with a control that parts as far, equivalent with
/// a caution; with one that parts far less, not, from the step DDP left its path.
#[test]
fn rounding_is_proven_by_a_control_run_not_assumed() {
    let t = |steps: &[[f32; 2]]| Trace {
        header: TraceHeader { run: Some(RunKind::Single), world_size: Some(1), ..TraceHeader::default() },
        steps: steps.iter().map(|g| vec![("w".to_string(), Values::f32s(g.to_vec()))]).collect(),
        finals: vec![("w".into(), Values::f32s(vec![0.1, 0.2]))],
        ..Trace::default()
    };
    let apart = |rels: [f32; 3]| rels.map(|r| [2.0 * (1.0 + r), 2.0]);
    let a = || t(&[[2.0, 2.0]; 3]);
    let b = || {
        let mut b = t(&apart([0.0, 4e-6, 2e-5]));
        (b.header.run, b.header.world_size) = (Some(RunKind::Ddp), Some(2));
        b
    };
    let judged = |control: Option<Trace>| {
        traces(Legs {
            accumulation: a(),
            ddp: b(),
            big: None,
            sampled: [false; 2],
            control,
            precision: None,
            precision_ddp: None,
        })
    };
    let alone = judged(None);
    assert_eq!(alone.runs.verdict, Agreement::Diverged);
    assert_eq!(alone.diagnosis.as_ref().map(|d| d.reason), Some(Reason::Unexplained));
    assert!(alone.diagnosis.unwrap().detail.contains("no control run"));
    // Step 0 agrees bit for bit: the nudge is float32's epsilon, 1.19e-7, rounded up.
    assert!(alone.control_wanted.is_some_and(|x| (x - 1.2e-7).abs() < 1e-12), "{:?}", alone.control_wanted);
    let nudged = |rels: [f32; 3]| {
        let mut c = t(&apart(rels));
        c.header.perturbed = Some(1.2e-7);
        c
    };
    let proven = judged(Some(nudged([1e-7, 3e-6, 1e-5])));
    assert_eq!(proven.runs.verdict, Agreement::WithinTolerance);
    assert_eq!((proven.diagnosis, proven.caution.map(|c| c.reason)), (None, Some(Reason::Chaos)));
    let left = judged(Some(nudged([1e-7, 2e-7, 4e-7])));
    assert_eq!(left.runs.verdict, Agreement::Diverged);
    let d = left.diagnosis.expect("a cause");
    assert_eq!(d.reason, Reason::Unexplained);
    assert!(d.detail.contains("from step 1") && d.detail.contains("not rounding"), "{}", d.detail);
}

/// Autocast in the DDP leg alone, the gradients agreeing bit for bit: a recorded fact
/// apart decides (the precision stage), and the verdict line says the numbers agreed.
#[test]
fn precision_apart_decides_where_the_numbers_agree() {
    let t = |run: RunKind, world: usize| Trace {
        header: TraceHeader {
            run: Some(run),
            world_size: Some(world),
            dtype: Some(Dtype::Float32),
            torch_version: Some("2.13.0".into()),
            ..TraceHeader::default()
        },
        steps: vec![vec![("w".to_string(), Values::f32s(vec![0.5, -1.0]))]],
        finals: vec![("w".into(), Values::f32s(vec![0.25, 0.75]))],
        ..Trace::default()
    };
    let mut ddp = t(RunKind::Ddp, 3);
    ddp.header.autocast = Some(Dtype::Bfloat16);
    let legs = Legs {
        accumulation: t(RunKind::Single, 1),
        ddp,
        big: None,
        sampled: [false; 2],
        control: None,
        precision: None,
        precision_ddp: None,
    };
    let o = traces(legs);
    assert!(o.runs.by_fact && o.runs.verdict == Agreement::Diverged);
    let d = o.diagnosis.as_ref().expect("a cause");
    assert_eq!(d.reason, Reason::PrecisionApart);
    assert!(d.detail.contains("bfloat16 (autocast)") && d.detail.contains("float32"), "{}", d.detail);
    // Legs that reach their precision otherwise ask for no precision control.
    assert_eq!(o.precision_wanted, None);
}

/// Two steps of one parameter, both runs clipped at every step from norms one factor
/// apart, DDP reducing both micro-batches of each step through DDP's engine.
fn legs() -> Legs {
    let trace = |run: RunKind, norm: f64| Trace {
        header: TraceHeader { run: Some(run), ..TraceHeader::default() },
        steps: vec![vec![("w".into(), Values::f32s(vec![0.5, -1.0]))]; 2],
        finals: vec![("w".into(), Values::f32s(vec![0.25, 0.75]))],
        facts: crate::evidence::StepFacts { clip_norms: vec![Some((norm, 1.0)); 2], ..Default::default() },
        ..Trace::default()
    };
    let mut ddp = trace(RunKind::Ddp, 4.0);
    ddp.header.engine = Some(Engine::Ddp);
    ddp.facts.ddp_sync = vec![vec![true, true]; 2];
    ddp.facts.comm = vec![Some((2, 4_000)); 2];
    Legs {
        accumulation: trace(RunKind::Accumulation, 2.0),
        ddp,
        big: None,
        sampled: [false; 2],
        control: None,
        precision: None,
        precision_ddp: None,
    }
}

fn own(legs: Legs) -> Outcome {
    let cfg = Config::judging(TrainConfig::article(), Tolerance::default(), false);
    let mut judging = Judging::new(&cfg, None);
    judging.steps_of(&legs.accumulation, &legs.ddp, None);
    judging.finish(legs.accumulation, legs.ddp, None)
}

fn traces(legs: Legs) -> Outcome {
    let opts = CompareOptions {
        paths: [PathBuf::from("acc.safetensors"), PathBuf::from("ddp.safetensors")],
        big: None,
        control: None,
        precision: None,
        precision_ddp: None,
        tolerance: crate::spec::ToleranceOverrides::default(),
        reports: Vec::new(),
        plot: None,
        strict_buffers: false,
    };
    judge(legs, Terms::Traces(&opts))
}

/// Our own runs and users' traces go through one judgement: the same caution beside
/// the same verdict, and the same costs, whichever path the legs came by.
#[test]
fn both_paths_judge_caution_and_costs_alike() {
    for (outcome, left) in [(own(legs()), "accumulation"), (traces(legs()), "acc")] {
        assert_eq!(outcome.verdict(), crate::judge::Verdict::Equivalent);
        let caution = outcome.caution.as_ref().expect("a caution");
        assert_eq!(caution.reason, Reason::HiddenFactor, "{}", caution.detail);
        let said = format!("ddp's total gradient norm before clipping was 2.0000x {left}'s");
        assert!(caution.detail.contains(&said), "{}", caution.detail);
        assert_eq!(outcome.costs.len(), 1);
        assert_eq!((outcome.costs[0].label.as_str(), outcome.costs[0].reduced), ("ddp", Some(2)));
    }
    // Without the factor clipping hides, the needless reductions are the caution.
    for outcome in [own, traces].map(|judged| {
        let mut legs = legs();
        legs.ddp.facts.clip_norms = legs.accumulation.facts.clip_norms.clone();
        judged(legs)
    }) {
        assert_eq!(outcome.caution.map(|c| c.reason), Some(Reason::NeedlessSync));
    }
}
