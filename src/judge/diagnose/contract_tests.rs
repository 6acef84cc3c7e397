//! One run's contracts on made-up facts (`ddp-verify watch`): a DDP run of W=2 ranks with
//! K/W=2 micro-batches each, honest, then one stage broken at a time; the step, stage and
//! owner named, and nothing named where the facts cannot tell.

use crate::evidence::{
    Batch, Engine, Framework, NormaliserScope, RankDrift, RankHeld, Rows, RunKind, StageStep, Trace, TraceHeader,
    Values,
};
use crate::judge::diagnose::{contracts, Diagnosis};
use crate::judge::Comparer;
use crate::spec::Tolerance;

const G: [f32; 4] = [1.0, -2.0, 0.5, 3.0];
const LOSSES: [f64; 4] = [2.0, 3.0, 2.5, 4.0];

/// Two ranks' 2 micro-batches each, losses means scaled by `scale`, samples 4 distinct rows
/// each (`shared`: rank 1 holds rank 0's), local sums over ranks 2·ΣG, applied ΣG·`applied`.
fn run(scale: f64, applied: f32, shared: bool, steps: usize) -> Trace {
    let batches: Vec<Batch> = (0..4)
        .map(|i| Batch {
            rank: i / 2,
            fingerprint: Some(i as u64 + 1),
            forward: Some(LOSSES[i]),
            peeled: Some(LOSSES[i]),
            root: Some(LOSSES[i] * scale),
            rows: Some(Rows { start: i * 2, count: 2, every: 1 }),
            ..Batch::default()
        })
        .collect();
    let samples = match shared {
        true => vec![1, 2, 3, 4, 1, 2, 3, 4],
        false => (1..=8).collect(),
    };
    let local = 2.0 * G.iter().map(|&v| f64::from(v)).sum::<f64>();
    let stage =
        StageStep { batches, local: [("w".to_string(), local)].into_iter().collect(), samples, ..StageStep::default() };
    let g: Vec<f32> = G.iter().map(|v| v * applied).collect();
    let mut t = Trace {
        header: TraceHeader {
            version: Some(2),
            run: Some(RunKind::Ddp),
            world_size: Some(2),
            versions: Some("torch==2.13.0".into()),
            loss_reduction: Some("mean".into()),
            ..TraceHeader::default()
        },
        steps: (0..steps).map(|_| vec![("w".to_string(), Values::f32s(g.clone()))]).collect(),
        finals: vec![("w".to_string(), Values::f32s(vec![0.1, 0.2, 0.3, 0.4]))],
        ..Trace::default()
    };
    t.facts.stages = vec![stage; steps];
    t.facts.micro = vec![2; steps];
    t
}

fn judged(t: &Trace) -> Option<Diagnosis> {
    let c = Comparer::new("the contract", "this run", &Tolerance::default(), None).finish(t, t, false);
    contracts(t, &c)
}

fn said(d: &Diagnosis) -> (Option<usize>, &str, &str) {
    let l = d.located.as_ref().expect("located");
    (d.step, l.stage.name(), l.owner.name())
}

#[test]
fn an_honest_run_keeps_every_contract() {
    // Each loss / 2 on each rank, the ranks' local sums averaged.
    assert_eq!(judged(&run(0.5, 1.0, false, 2)), None);
}

#[test]
fn a_loss_never_divided_is_named_with_its_direction() {
    let d = judged(&run(1.0, 1.0, false, 1)).expect("broken");
    assert_eq!(said(&d), (Some(0), "scaling", "script"));
    assert!(d.detail.contains("2.00x what its 2 micro-batches per process need"), "{}", d.detail);
    // Divided by K=4 on every rank: too much, the other advice.
    let d = judged(&run(0.25, 1.0, false, 1)).expect("broken");
    assert!(d.detail.contains("divides each loss by 4.00 where the 2 micro-batches"), "{}", d.detail);
}

#[test]
fn a_sum_loss_is_not_held_to_a_means_scaling() {
    // The script sums each micro-batch and divides by a count of its own: unknown to one run.
    let mut t = run(0.1, 1.0, false, 1);
    t.header.loss_reduction = Some("sum".into());
    assert_eq!(judged(&t), None);
}

#[test]
fn ranks_on_the_same_samples_are_the_scripts() {
    let d = judged(&run(0.5, 1.0, true, 1)).expect("broken");
    assert_eq!(said(&d), (Some(0), "samples", "script"));
    assert!(d.detail.contains("ranks 0 and 1 trained on the same samples"), "{}", d.detail);
}

#[test]
fn a_reduction_that_sums_is_the_engines() {
    let mut t = run(0.5, 2.0, false, 1);
    t.header.engine = Some(Engine::Fsdp2);
    t.header.versions = Some("torch==2.8.0".into());
    let d = judged(&t).expect("broken");
    assert_eq!(said(&d), (Some(0), "reduction", "torch"));
    assert!(d.detail.contains("2.00x too large"), "{}", d.detail);
}

#[test]
fn normalisers_counted_on_each_rank_are_named_and_counted_alike_are_not() {
    let normalised = |counts: [f64; 2]| {
        let mut t = run(1.0, 1.0, false, 1);
        t.header.loss_reduction = Some("sum".into());
        t.header.normalised_by = Some(Framework::Transformers);
        t.header.versions = Some("torch==2.13.0, transformers==4.48.3".into());
        for b in &mut t.facts.stages[0].batches {
            b.normaliser = Some(counts[b.rank]);
        }
        t
    };
    let d = judged(&normalised([43.0, 39.0])).expect("broken");
    assert_eq!(said(&d), (Some(0), "loss", "transformers"));
    // Each rank counting its own N/W items of a window with as many on each: every item
    // weighs 1/N once DDP averages, as in one process.
    assert_eq!(judged(&normalised([40.0, 40.0])), None);
    // Where the script's own setting made each rank count alone, the choice is the script's.
    let mut t = normalised([43.0, 39.0]);
    (t.header.normaliser_scope, t.header.normaliser_scope_by) = (Some(NormaliserScope::Rank), Some(Framework::Plain));
    let d = judged(&t).expect("broken");
    assert_eq!(said(&d), (Some(0), "loss", "script"));
    assert!(d.detail.contains("average_tokens_across_devices=True"), "{}", d.detail);
}

#[test]
fn the_first_step_that_breaks_one_is_named() {
    let mut t = run(0.5, 1.0, false, 3);
    t.facts.stages[2].zeroed = 1;
    let d = judged(&t).expect("broken");
    assert_eq!(said(&d), (Some(2), "local gradient", "script"));
    // Ranks apart after step 1 come first.
    t.facts.rank_drift = Some(RankDrift { step: 1, rank: 1, tensor: RankHeld::Param("w".into()) });
    let d = judged(&t).expect("broken");
    assert_eq!((d.step, d.located.as_ref().unwrap().stage.name()), (Some(1), "update"));
}

#[test]
fn micro_batches_each_normalised_by_their_own_count_break_the_loss_contract() {
    // Each micro-batch's summed loss divided by the count n it was passed (its graph shows
    // it: the factor peeled off is 1/n, times `scale`).
    let own = |scale: f64, counts: [f64; 4], follows: bool| {
        let mut t = run(scale, 1.0, false, 1);
        t.header.loss_reduction = Some("sum".into());
        for (i, b) in t.facts.stages[0].batches.iter_mut().enumerate() {
            b.normaliser = Some(counts[i]);
            b.peeled = Some(if follows { LOSSES[i] * counts[i] } else { LOSSES[i] });
        }
        t
    };
    // Each by its own count, then by k=2: the window's items weigh 1/(2n).
    let d = judged(&own(0.5, [10.0, 30.0, 20.0, 20.0], true)).expect("broken");
    assert_eq!(said(&d), (Some(0), "loss", "script"));
    let says = "rank 0 divided each micro-batch's loss by a count of its own (num_items_in_batch 10, 30";
    assert!(d.detail.contains(says), "{}", d.detail);
    // The window's count over both ranks, never divided again (Trainer): every item 1/N.
    assert_eq!(judged(&own(1.0, [80.0; 4], true)), None);
    // Counts passed and not followed (a loss of the script's own): not this contract's.
    let d = judged(&own(0.5, [10.0, 30.0, 20.0, 20.0], false));
    assert!(d.as_ref().is_none_or(|d| !d.detail.contains("a count of its own")), "{d:?}");
}

#[test]
fn a_normaliser_of_a_declared_scope_is_read_as_the_framework_set_it() {
    // A window's count over both ranks (N=80, loss = sum/N): DDP's average wants each rank's
    // loss times W. Scaled by 1 it reads as a count of each rank's own (weighs 1/(W·N)),
    // which it is not where the framework says it counted the world.
    let counted = |scale: f64, scope: Option<NormaliserScope>| {
        let mut t = run(scale, 1.0, false, 1);
        t.header.loss_reduction = Some("sum".into());
        t.header.normaliser_scope = scope;
        for b in &mut t.facts.stages[0].batches {
            b.normaliser = Some(80.0);
        }
        t
    };
    assert_eq!(judged(&counted(1.0, None)), None);
    assert_eq!(judged(&counted(2.0, Some(NormaliserScope::World))), None);
    let d = judged(&counted(1.0, Some(NormaliserScope::World))).expect("broken");
    assert_eq!(said(&d).1, "scaling");
    assert!(d.detail.contains("2.00x smaller"), "{}", d.detail);
    assert_eq!(judged(&counted(1.0, Some(NormaliserScope::Rank))), None);
}

#[test]
fn a_factor_read_off_a_narrow_dtypes_losses_is_known_to_its_rounding() {
    // A bfloat16 loss divided by 3 (DeepSpeed's bf16 engine, K/W = 3): 1/3 and the product
    // rounded to bfloat16: the factor 0.3340 where 1/3 is wanted, up to 2 roundings off (0.4% here).
    let mut t = run(0.5 * 1.004, 1.0, false, 1);
    t.header.loss_dtype = Some(crate::spec::Dtype::Bfloat16);
    assert_eq!(judged(&t), None);
    // Losses in float32: the same 0.4% is a factor apart.
    t.header.loss_dtype = Some(crate::spec::Dtype::Float32);
    let d = judged(&t).expect("broken");
    assert_eq!(said(&d).1, "scaling");
    // And in bfloat16 a factor well past its rounding still is.
    let mut t = run(0.5 * 1.05, 1.0, false, 1);
    t.header.loss_dtype = Some(crate::spec::Dtype::Bfloat16);
    assert_eq!(said(&judged(&t).expect("broken")).1, "scaling");
}
