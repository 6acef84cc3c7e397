//! Owners through framework stacks on made-up facts (walk_tests' legs): a loss a framework
//! handed to backward never divided, a division on top of a framework's, an epoch its
//! framework planned short.

use super::walk_tests::{judged, leg, said, sum, times, G};
use crate::evidence::{Framework, Trace};
use crate::judge::compare;
use crate::judge::diagnose::{Context, Reason};
use crate::spec::Tolerance;

/// A leg whose every loss a framework's code handed on (`handed`) to `api`'s backward, which
/// ran on what it was handed.
fn handed_on(mut t: Trace, handed: Framework, api: Framework) -> Trace {
    t.header.loss_handed_by = Some(handed);
    t.header.loss_api = Some(api);
    t.header.versions = Some("torch==2.13.0, transformers==4.48.3, accelerate==1.15.0".into());
    for b in t.facts.stages.iter_mut().flat_map(|s| &mut s.batches) {
        b.handed = b.root;
    }
    t
}

#[test]
fn a_loss_a_framework_hands_to_backward_never_divided_is_the_frameworks() {
    // Neither leg divides: accumulation's gradient 4x the mean's, each rank's 2x.
    let acc = handed_on(leg(1, 1.0, 4.0 * sum(&G), &times(4.0), 1), Framework::Transformers, Framework::Accelerate);
    let ddp = handed_on(leg(2, 1.0, 4.0 * sum(&G), &times(2.0), 1), Framework::Transformers, Framework::Accelerate);
    let d = judged(&acc, &ddp);
    let fix = Some("https://github.com/huggingface/transformers/pull/35651");
    assert_eq!(said(&d), ("scaling", "transformers", fix), "{d:?}");
    let l = d.located.as_ref().unwrap();
    assert_eq!(l.owner.version(), Some("4.48.3"));
    assert!(d.detail.contains("never divided") && d.detail.contains("upgrade transformers"), "{}", d.detail);
    // The script's own loop handed it to accelerator.backward: the script's division to make.
    let (acc, ddp) = (
        handed_on(acc, Framework::Plain, Framework::Accelerate),
        handed_on(ddp, Framework::Plain, Framework::Accelerate),
    );
    let d = judged(&acc, &ddp);
    assert_eq!(said(&d), ("scaling", "script", None), "{d:?}");
    assert!(!d.detail.contains("never divided"), "{}", d.detail);
}

#[test]
fn a_loss_divided_on_top_of_a_frameworks_division_stays_the_scripts() {
    // Lightning divides what training_step returns; the script divided by K already.
    let acc = handed_on(leg(1, 1.0 / 16.0, sum(&G) / 4.0, &times(0.25), 1), Framework::Lightning, Framework::Lightning);
    let ddp = handed_on(leg(2, 0.25, sum(&G), &times(0.5), 1), Framework::Lightning, Framework::Lightning);
    let d = judged(&acc, &ddp);
    assert_eq!(said(&d).1, "script", "{d:?}");
}

#[test]
fn an_epoch_its_framework_planned_short_is_that_frameworks_at_the_samples_stage() {
    // Trainer planned 3 steps for an epoch of 14 batches at 4 per step; the other run took 4.
    let mut acc = leg(1, 0.25, sum(&G), &G, 3);
    acc.header.steps = Some(3);
    acc.header.versions = Some("torch==2.13.0, transformers==4.51.3".into());
    let plan = |t: &mut Trace, steps, loader, k| {
        (t.header.planned_steps, t.header.planned_loader) = (Some(steps), Some(loader));
        (t.header.planned_accumulation, t.header.planned_epochs) = (Some(k), Some(1.0));
        t.header.planned_by = Some(Framework::Transformers);
    };
    plan(&mut acc, 3, 14, 4);
    let mut other = leg(1, 0.25, sum(&G), &G, 4);
    other.header.steps = Some(4);
    plan(&mut other, 4, 4, 1);
    let judged_big = |acc: &Trace| {
        let c = compare("accumulation", acc, "big-batch", &other, &Tolerance::default());
        crate::judge::diagnose::big_batch(acc, &other, &c, &Context::of_traces(acc, &other), true).expect("a cause")
    };
    let d = judged_big(&acc);
    assert_eq!(
        (d.reason, said(&d)),
        (
            Reason::EpochCutShort,
            ("samples", "transformers", Some("https://github.com/huggingface/transformers/pull/37923"))
        ),
        "{d:?}"
    );
    assert!(d.detail.contains("last 2 batch(es)"), "{}", d.detail);
    // Rounded up (4 steps for 4 windows): no cut, whatever else parts the runs.
    plan(&mut acc, 4, 14, 4);
    assert_ne!(judged_big(&acc).reason, Reason::EpochCutShort);
}

#[test]
fn a_plan_of_absurd_size_is_judged_without_overflow() {
    // A hand-made header: epochs and batches far past any run's. Named, not a panic.
    let mut acc = leg(1, 0.25, sum(&G), &G, 3);
    acc.header.steps = Some(3);
    (acc.header.planned_steps, acc.header.planned_loader) = (Some(3), Some(usize::MAX - 1));
    (acc.header.planned_accumulation, acc.header.planned_epochs) = (Some(4), Some(1e300));
    acc.header.planned_by = Some(Framework::Transformers);
    let mut other = leg(1, 0.25, sum(&G), &G, 4);
    other.header.steps = Some(4);
    let c = compare("accumulation", &acc, "big-batch", &other, &Tolerance::default());
    let d = crate::judge::diagnose::big_batch(&acc, &other, &c, &Context::of_traces(&acc, &other), true);
    assert_eq!(d.map(|d| d.reason), Some(Reason::EpochCutShort));
}
