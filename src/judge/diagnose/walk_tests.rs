//! The walk on made-up facts: two legs' stage facts built by construction (K=4 micro-batches,
//! W=2 ranks), one stage broken at a time, and the stage, owner and known fix it names.

use crate::evidence::{Batch, Engine, Framework, RunKind, StageStep, Trace, TraceHeader, Values};
use crate::judge::diagnose::{diagnose, Context, Diagnosis};
use crate::judge::{compare, Reason};
use crate::spec::Tolerance;

pub(super) const G: [f32; 4] = [1.0, -2.0, 0.5, 3.0];
const LOSSES: [f64; 4] = [2.0, 3.0, 2.5, 4.0];

/// One leg: `world` ranks, each micro-batch's inputs 1..=4 with its loss scaled by `scale`,
/// the local gradient sum over ranks `local` and the gradient applied `g`, for `steps` steps.
pub(super) fn leg(world: usize, scale: f64, local: f64, g: &[f32], steps: usize) -> Trace {
    let batches: Vec<Batch> = (0..4)
        .map(|i| Batch {
            rank: i * world / 4,
            fingerprint: Some(i as u64 + 1),
            forward: Some(LOSSES[i]),
            peeled: Some(LOSSES[i]),
            root: Some(LOSSES[i] * scale),
            ..Batch::default()
        })
        .collect();
    let stage = StageStep {
        batches,
        local: [("w".to_string(), local)].into_iter().collect(),
        step_calls: None,
        zeroed: 0,
        samples: vec![],
    };
    let mut t = Trace {
        header: TraceHeader {
            version: Some(2),
            run: Some(if world > 1 { RunKind::Ddp } else { RunKind::Single }),
            world_size: Some(world),
            versions: Some("torch==2.13.0".into()),
            ..TraceHeader::default()
        },
        steps: (0..steps).map(|_| vec![("w".to_string(), Values::f32s(g.to_vec()))]).collect(),
        finals: vec![("w".to_string(), Values::f32s(vec![0.1, 0.2, 0.3, 0.4]))],
        ..Trace::default()
    };
    t.facts.stages = vec![stage; steps];
    t.facts.micro = vec![(4 / world) as i64; steps];
    t
}

pub(super) fn sum(g: &[f32]) -> f64 {
    g.iter().map(|&v| f64::from(v)).sum()
}

pub(super) fn times(k: f32) -> Vec<f32> {
    G.iter().map(|v| v * k).collect()
}

pub(super) fn judged(a: &Trace, b: &Trace) -> Diagnosis {
    let c = compare("accumulation", a, "ddp", b, &Tolerance::default());
    diagnose(a, b, &c, &Context::of_traces(a, b)).expect("a divergence has a cause")
}

pub(super) fn said(d: &Diagnosis) -> (&str, &str, Option<&str>) {
    let l = d.located.as_ref().expect("located");
    (l.stage.name(), l.owner.name(), l.known_fix.map(|f| f.tracker.as_str()))
}

/// Accumulation: each loss / 4, one process. DDP, honest: each loss / 2, averaged over 2.
fn honest_acc() -> Trace {
    leg(1, 0.25, sum(&G), &G, 1)
}

#[test]
fn a_reduction_that_sums_is_the_engines_at_its_version() {
    // DDP's local gradients (each loss / 2) summed over the ranks and applied as they are.
    let mut ddp = leg(2, 0.5, 2.0 * sum(&G), &times(2.0), 1);
    ddp.header.engine = Some(Engine::Fsdp2);
    ddp.header.versions = Some("torch==2.8.0".into());
    let d = judged(&honest_acc(), &ddp);
    assert_eq!(d.reason, Reason::SummedOverRanks, "{d:?}");
    assert_eq!(said(&d), ("reduction", "torch", Some("https://github.com/pytorch/pytorch/issues/162338")));
    assert!(d.detail.contains("2.00x too large") && d.detail.contains("torch 2.8.0"), "{}", d.detail);
    // The same facts at a version the table does not list: located alike, not annotated.
    ddp.header.versions = Some("torch==2.13.0".into());
    assert_eq!(said(&judged(&honest_acc(), &ddp)), ("reduction", "torch", None));
}

#[test]
fn a_reduction_that_divides_again_is_the_other_direction() {
    let mut ddp = leg(2, 0.5, 2.0 * sum(&G), &times(0.25), 1);
    ddp.header.engine = Some(Engine::DeepSpeed2);
    ddp.header.versions = Some("torch==2.13.0, deepspeed==0.18.3".into());
    let d = judged(&honest_acc(), &ddp);
    assert_eq!(said(&d), ("reduction", "deepspeed", None));
    assert!(d.detail.contains("4.00x too small"), "{}", d.detail);
}

#[test]
fn a_loss_divided_by_k_on_every_rank_is_the_scripts_scaling() {
    // Each rank divides by K=4, not K/W=2: half the gradient, averaged correctly.
    let ddp = leg(2, 0.25, sum(&G), &times(0.5), 1);
    let d = judged(&honest_acc(), &ddp);
    assert_eq!(said(&d), ("scaling", "script", None), "{d:?}");
}

#[test]
fn a_normaliser_counted_per_rank_is_the_loss_stage_of_the_framework_that_passed_it() {
    let acc = {
        let mut t = honest_acc();
        t.facts.stages[0].batches.iter_mut().for_each(|b| b.normaliser = Some(100.0));
        t
    };
    let mut ddp = leg(2, 0.5, 2.0 * sum(&G), &times(1.3), 1);
    for b in ddp.facts.stages[0].batches.iter_mut() {
        let n = if b.rank == 0 { 40.0 } else { 60.0 };
        b.normaliser = Some(n);
        b.forward = b.forward.map(|l| l * 100.0 / n);
    }
    ddp.header.normalised_by = Some(Framework::Transformers);
    ddp.header.versions = Some("torch==2.13.0, transformers==4.46.0".into());
    let d = judged(&acc, &ddp);
    assert_eq!(said(&d), ("loss", "transformers", Some("https://github.com/huggingface/transformers/issues/34242")));
    assert!(d.detail.contains("num_items_in_batch=100") && d.detail.contains("num_items_in_batch=40"), "{}", d.detail);
}

#[test]
fn other_inputs_are_the_samples_stage() {
    let mut ddp = leg(2, 0.5, 2.0 * sum(&G), &times(1.3), 1);
    ddp.facts.stages[0].batches[3].fingerprint = Some(99);
    let d = judged(&honest_acc(), &ddp);
    assert_eq!(said(&d), ("samples", "script", None), "{d:?}");
    assert!(d.detail.contains("rank 1 micro-batch 2"), "{}", d.detail);
}

#[test]
fn a_wrapper_told_to_accumulate_that_steps_early_is_the_frameworks() {
    // DDP: the wrapper was told 2 micro-batches per step but its optimizer stepped after each.
    let acc = leg(1, 0.25, sum(&G), &G, 2);
    let mut ddp = leg(2, 0.5, 2.0 * sum(&G), &G, 4);
    ddp.facts.micro = vec![1; 4];
    ddp.facts.stages.iter_mut().for_each(|s| s.step_calls = Some(1));
    ddp.header.framework = Some(Framework::Accelerate);
    ddp.header.framework_accumulation = Some(2);
    ddp.header.versions = Some("torch==2.13.0, accelerate==0.30.1".into());
    let d = judged(&acc, &ddp);
    assert_eq!(said(&d), ("update", "accelerate", Some("https://github.com/huggingface/accelerate/pull/2790")));
    // Not told to accumulate: the script's own loop steps every micro-batch.
    ddp.header.framework_accumulation = Some(1);
    let d = judged(&acc, &ddp);
    assert_eq!((d.reason, said(&d).1), (Reason::StepCount, "script"), "{d:?}");
}

#[test]
fn gradients_scaled_inside_a_frameworks_backward_are_its_scaling() {
    // The roots scaled alike, averaged alike; the gradients came out of backward 2x apart.
    let mut ddp = leg(2, 0.5, 4.0 * sum(&G), &times(2.0), 1);
    let d = judged(&honest_acc(), &ddp);
    assert_eq!(said(&d), ("local gradient", "script", None), "{d:?}");
    ddp.header.backward_by = Some(Framework::DeepSpeed);
    ddp.header.loss_api = Some(Framework::Accelerate);
    ddp.header.versions = Some("torch==2.13.0, deepspeed==0.18.3".into());
    let d = judged(&honest_acc(), &ddp);
    assert_eq!(said(&d), ("scaling", "deepspeed", Some("https://github.com/deepspeedai/DeepSpeed/pull/7724")));
}

#[test]
fn gradients_zeroed_inside_the_window_belong_to_whoever_zeroed_them() {
    // The last micro-batch's gradient alone reached DDP's step: zeroed once mid-window.
    let mut ddp = leg(2, 0.5, 2.0 * sum(&G), &times(0.6), 1);
    ddp.facts.stages[0].zeroed = 1;
    ddp.header.zeroed_by = Some(Framework::Lightning);
    ddp.header.versions = Some("torch==2.13.0, lightning==2.0.9".into());
    let d = judged(&honest_acc(), &ddp);
    let fix = Some("https://github.com/Lightning-AI/pytorch-lightning/pull/18619");
    assert_eq!(said(&d), ("local gradient", "lightning", fix), "{d:?}");
    ddp.header.zeroed_by = Some(Framework::Plain);
    assert_eq!(said(&judged(&honest_acc(), &ddp)), ("local gradient", "script", None));
}

#[test]
fn gradients_scaled_inside_backward_are_found_before_the_roots_scaling() {
    // Both legs hand backward their losses unscaled; the engine's hooks divide inside it,
    // by K^2=16 in one process and (K/W)^2=4 per rank: the roots alone would blame them.
    let deepspeed = |t: &mut Trace| {
        t.header.loss_api = Some(Framework::DeepSpeed);
        t.header.backward_by = Some(Framework::DeepSpeed);
        t.header.versions = Some("torch==2.13.0, deepspeed==0.18.6".into());
    };
    let mut acc = leg(1, 1.0, sum(&G) / 16.0, &times(1.0 / 16.0), 1);
    let mut ddp = leg(2, 1.0, sum(&G) / 4.0, &times(1.0 / 8.0), 1);
    deepspeed(&mut acc);
    deepspeed(&mut ddp);
    ddp.header.engine = Some(Engine::DeepSpeed2);
    let d = judged(&acc, &ddp);
    let fix = Some("https://github.com/deepspeedai/DeepSpeed/pull/8245");
    assert_eq!(said(&d), ("scaling", "deepspeed", fix), "{d:?}");
}

#[test]
fn micro_batches_lost_between_boundaries_marked_by_hand_are_the_engines() {
    // One process, gradient_accumulation_steps=1, four backwards per engine step: parameter
    // v kept one of its micro-batches (1 of 8 applied), w all of them.
    let mut acc = leg(1, 0.25, sum(&G), &G, 1);
    acc.facts.stages[0].local.insert("v".into(), 8.0);
    acc.steps[0].push(("v".into(), Values::f32s(vec![1.0])));
    acc.header.loss_api = Some(Framework::DeepSpeed);
    acc.header.engine_accumulation = Some(1);
    acc.header.versions = Some("torch==2.13.0, deepspeed==0.18.6".into());
    let mut ddp = leg(2, 0.5, 2.0 * sum(&G), &G, 1);
    ddp.facts.stages[0].local.insert("v".into(), 16.0);
    ddp.steps[0].push(("v".into(), Values::f32s(vec![8.0])));
    // Not marked by hand: the script told the engine one backward per step.
    assert_eq!(judged(&acc, &ddp).reason, Reason::EngineBoundary);
    acc.header.boundary_by = Some(Framework::Plain);
    let d = judged(&acc, &ddp);
    let fix = Some("https://github.com/deepspeedai/DeepSpeed/pull/7981");
    assert_eq!(said(&d), ("local gradient", "deepspeed", fix), "{d:?}");
    assert!(d.detail.contains("your script marked by hand"), "{}", d.detail);
}

#[test]
fn one_process_without_local_sums_reads_them_from_its_applied_gradient() {
    // The recorder spares one plain process the hooks: its applied gradient stands in.
    let mut acc = honest_acc();
    acc.facts.stages[0].local.clear();
    let mut ddp = leg(2, 0.5, 4.0 * sum(&G), &times(2.0), 1);
    ddp.header.backward_by = Some(Framework::DeepSpeed);
    ddp.header.versions = Some("torch==2.13.0, deepspeed==0.18.3".into());
    let d = judged(&acc, &ddp);
    assert_eq!(said(&d), ("scaling", "deepspeed", Some("https://github.com/deepspeedai/DeepSpeed/pull/7724")));
}

/// At step 0 both runs start from the same weights: each process's first micro-batch gives
/// the same loss, and a later one another (weight decay by hand after every micro-batch, K
/// times a step in one process, K/W on each rank): the weights moved inside the window.
#[test]
fn losses_apart_after_each_process_s_first_micro_batch_are_weights_moved_in_the_window() {
    let decayed = |t: &mut Trace, nth: &[usize]| {
        for (b, n) in t.facts.stages[0].batches.iter_mut().zip(nth) {
            let l = b.forward.unwrap() * (1.0 + 1e-4 * *n as f64);
            (b.forward, b.peeled) = (Some(l), Some(l));
        }
    };
    let mut acc = honest_acc();
    decayed(&mut acc, &[0, 1, 2, 3]);
    let mut ddp = leg(2, 0.5, 2.0 * sum(&G), &times(1.001), 1);
    decayed(&mut ddp, &[0, 1, 0, 1]);
    let d = judged(&acc, &ddp);
    assert_eq!(d.reason, Reason::DifferentGradients, "{d:?}");
    assert_eq!(said(&d), ("update", "script", None));
    assert!(d.detail.contains("the weights moved inside the accumulation window"), "{}", d.detail);
}

/// Each rank divides its losses by a count of its own micro-batches, where the one process
/// divides every micro-batch by the step's: the scaling stage, the script's.
#[test]
fn a_normaliser_of_each_rank_s_own_is_the_scripts_scaling() {
    let mut ddp = leg(2, 0.5, 2.0 * sum(&G), &times(1.05), 1);
    for b in ddp.facts.stages[0].batches.iter_mut() {
        b.root = Some(b.forward.unwrap() * if b.rank == 0 { 0.55 } else { 0.45 });
    }
    let d = judged(&honest_acc(), &ddp);
    assert_eq!(d.reason, Reason::TokenCountPerRank, "{d:?}");
    assert_eq!(said(&d), ("scaling", "script", None));
    assert!(d.detail.contains("rank 0 by 5.5000e-1, rank 1 by 4.5000e-1"), "{}", d.detail);
}

/// The samples each micro-batch held, hashed: `groups[i]` for micro-batch i (2 each), and a
/// fingerprint of the group.
fn holding(t: &mut Trace, groups: [[u64; 2]; 4]) {
    use crate::evidence::Rows;
    let st = &mut t.facts.stages[0];
    st.samples = groups.iter().flatten().map(|h| h * 2).collect();
    for (i, b) in st.batches.iter_mut().enumerate() {
        b.rows = Some(Rows { start: 2 * i, count: 2, every: 1 });
        b.fingerprint = Some(groups[i][0] * 100 + groups[i][1]);
    }
}

/// One process read micro-batches [0,1] [2,3] [4,5] [6,7]; DDP's strided sampler gave rank 0
/// [0,2] [4,6] and rank 1 [1,3] [5,7]: the same samples in the step.
const CONSECUTIVE: [[u64; 2]; 4] = [[0, 1], [2, 3], [4, 5], [6, 7]];
const STRIDED: [[u64; 2]; 4] = [[0, 2], [4, 6], [1, 3], [5, 7]];

#[test]
fn the_same_samples_grouped_otherwise_are_not_the_samples_stage() {
    // A loss never divided, in both legs: one process's gradient 4 means, each rank's 2.
    let mut acc = leg(1, 1.0, 4.0 * sum(&G), &times(4.0), 1);
    let mut ddp = leg(2, 1.0, 4.0 * sum(&G), &times(2.0), 1);
    holding(&mut acc, CONSECUTIVE);
    holding(&mut ddp, STRIDED);
    let d = judged(&acc, &ddp);
    assert_eq!(said(&d), ("scaling", "script", None), "{d:?}");
    // Never divided: the advice divides, and names the leg that needs it most.
    assert!(d.detail.contains("accumulation scales each loss by 1.0000, 4.00x"), "{}", d.detail);
    assert!(!d.detail.contains("divided twice"), "{}", d.detail);
    // One sample apart is other samples, counted as samples.
    ddp.facts.stages[0].samples[3] = 99;
    let d = judged(&acc, &ddp);
    assert_eq!(said(&d), ("samples", "script", None), "{d:?}");
    assert!(d.detail.contains("1 of 8 samples differ") && d.detail.contains("rank 0 micro-batch 2"), "{}", d.detail);
}

#[test]
fn a_grouping_is_named_only_where_a_layer_mixes_a_micro_batchs_samples() {
    let mut acc = honest_acc();
    let mut ddp = leg(2, 0.5, 2.0 * sum(&G), &times(1.3), 1);
    holding(&mut acc, CONSECUTIVE);
    holding(&mut ddp, STRIDED);
    ddp.header.coupled = Some("2 BatchNorm layers in training mode".into());
    let d = judged(&acc, &ddp);
    assert_eq!((d.reason, said(&d)), (Reason::Regrouped, ("samples", "script", None)), "{d:?}");
    assert!(d.detail.contains("2 BatchNorm layers in training mode"), "{}", d.detail);
    ddp.header.coupled = None;
    assert_ne!(judged(&acc, &ddp).reason, Reason::Regrouped);
}

#[test]
fn never_divided_and_divided_twice_get_opposite_advice_from_the_facts() {
    // A Trainer passes num_items_in_batch to a model that returns its own mean: the same
    // micro-batch's loss is the same under another normaliser, so nothing divided it.
    let normalised = |t: &mut Trace, n: f64| {
        t.facts.stages[0].batches.iter_mut().for_each(|b| b.normaliser = Some(n));
        t.header.loss_handed_by = Some(Framework::Transformers);
        t.header.normalised_by = Some(Framework::Transformers);
        t.header.versions = Some("torch==2.13.0, transformers==4.46.0".into());
    };
    let mut acc = leg(1, 1.0, 4.0 * sum(&G), &times(4.0), 1);
    let mut ddp = leg(2, 1.0, 4.0 * sum(&G), &times(2.0), 1);
    normalised(&mut acc, 400.0);
    normalised(&mut ddp, 200.0);
    let never = judged(&acc, &ddp);
    assert_eq!(said(&never).0, "scaling", "{never:?}");
    assert!(!never.detail.contains("divided twice"), "{}", never.detail);
    assert!(never.detail.contains("4.00x what its 4 micro-batches"), "{}", never.detail);
    // Its inverse: losses normalised over the window's tokens counted across ranks (they
    // follow the normaliser: a quarter of each mean), which DDP must then multiply by W; its
    // loss is divided by W instead: divided twice.
    let mut acc = leg(1, 1.0, sum(&G), &G, 1);
    let mut ddp = leg(2, 1.0, sum(&G), &times(0.25), 1);
    normalised(&mut acc, 400.0);
    normalised(&mut ddp, 400.0);
    for (t, root) in [(&mut acc, 1.0), (&mut ddp, 0.5)] {
        for b in t.facts.stages[0].batches.iter_mut() {
            b.forward = b.forward.map(|l| l / 4.0);
            b.peeled = b.forward;
            b.root = b.forward.map(|l| l * root);
        }
        t.facts.stages[0].local.insert("w".into(), sum(&G) * root);
    }
    let twice = judged(&acc, &ddp);
    assert_eq!(said(&twice).0, "scaling", "{twice:?}");
    assert!(twice.detail.contains("divided twice"), "{}", twice.detail);
    assert!(!twice.detail.contains("micro-batches per process need"), "{}", twice.detail);
}

#[test]
fn a_short_last_window_divided_by_k_belongs_to_the_code_that_divides() {
    // The epoch's last window: 2 of K=4 micro-batches, each loss still divided by 4; the big
    // batch takes the mean of the same samples.
    let mut acc = leg(1, 0.25, sum(&G) / 2.0, &times(0.5), 1);
    acc.facts.stages[0].batches.truncate(2);
    acc.header.acc_steps = Some(4);
    let big = leg(1, 1.0, sum(&G), &G, 1);
    let judged_big = |acc: &Trace| {
        let c = compare("accumulation", acc, "big-batch", &big, &Tolerance::default());
        crate::judge::diagnose::big_batch(acc, &big, &c, &Context::of_traces(acc, &big), true).expect("a cause")
    };
    let d = judged_big(&acc);
    assert_eq!((d.reason, said(&d)), (Reason::ShortWindowScaling, ("scaling", "script", None)), "{d:?}");
    assert!(d.detail.contains("ran 2 micro-batch(es) per process where a window holds 4"), "{}", d.detail);
    // A Trainer divided it: the Trainer's, at its version.
    acc.header.loss_handed_by = Some(Framework::Transformers);
    acc.header.versions = Some("torch==2.13.0, transformers==4.48.3".into());
    let d = judged_big(&acc);
    assert_eq!(said(&d).0, "scaling");
    assert_eq!(said(&d).1, "transformers", "{d:?}");
    assert!(d.detail.contains("upgrade transformers"), "{}", d.detail);
}

#[test]
fn a_deal_that_parts_no_sample_of_the_step_is_not_its_cause() {
    // DDP's sampler padded the epoch's end, yet step 0 holds the same samples, as many per
    // micro-batch: what parts it is the reduction's sum, not the deal.
    let mut acc = honest_acc();
    let mut ddp = leg(2, 0.5, 2.0 * sum(&G), &times(2.0), 1);
    holding(&mut acc, CONSECUTIVE);
    holding(&mut ddp, STRIDED);
    ddp.header.sampler_padded = Some(2);
    ddp.header.engine = Some(Engine::Fsdp2);
    let d = judged(&acc, &ddp);
    assert_eq!(said(&d).0, "reduction", "{d:?}");
    // The same deal where the step's samples differ is the deal's.
    ddp.facts.stages[0].samples[0] = 99;
    assert_eq!(judged(&acc, &ddp).reason, Reason::UnevenData);
}

/// Each micro-batch's loss (and what backward ran on) moved by its own mask draw, the
/// applied gradient with it: what a model with dropout on records in either leg.
fn masked(mut t: Trace, draws: [f64; 4]) -> Trace {
    for (b, m) in t.facts.stages[0].batches.iter_mut().zip(draws) {
        b.forward = b.forward.map(|l| l * m);
        b.peeled = b.peeled.map(|l| l * m);
        b.root = b.root.map(|r| r * m);
    }
    t.header.dropout = Some("4 dropout layers, p up to 0.1".into());
    t
}

#[test]
fn dropout_is_named_where_nothing_masks_cannot_move_parts() {
    // (A loss scaled otherwise under dropout is named as the masks: the roots differ by them,
    // and a framework may multiply between the normaliser and the loss, Trainer's W.)
    // Honest scaling and reduction; the losses and gradients differ by the masks alone.
    let ddp = || masked(leg(2, 0.5, 2.0 * sum(&G) * 1.05, &times(1.05), 1), [1.1, 0.93, 1.04, 0.97]);
    let d = judged(&honest_acc(), &ddp());
    assert_eq!(d.reason, Reason::DropoutMasks, "{d:?}");
    assert!(d.detail.contains("--no-dropout"), "{}", d.detail);
    // The same facts without dropout: the losses of the same inputs differ, at the loss stage.
    let mut bare = ddp();
    bare.header.dropout = None;
    assert_eq!(said(&judged(&honest_acc(), &bare)).0, "loss");
    // Under dropout a reduction that sums is still the engine's: each leg's own divide.
    let mut summed = masked(leg(2, 0.5, 2.0 * sum(&G) * 1.05, &times(2.1), 1), [1.1, 0.93, 1.04, 0.97]);
    summed.header.engine = Some(Engine::Fsdp2);
    let d = judged(&honest_acc(), &summed);
    assert_eq!(said(&d).0, "reduction", "{d:?}");
}

#[test]
fn normalisers_each_rank_counts_alike_are_cancelled_by_the_average() {
    // One process divides each micro-batch's sum by the window's 100 items; each of 2 ranks
    // by its own 50, and the ranks' average halves it: every item weighs 1/100 in both.
    let mut acc = honest_acc();
    for b in acc.facts.stages[0].batches.iter_mut() {
        b.normaliser = Some(100.0);
        b.root = b.forward;
    }
    let counted = || {
        let mut ddp = leg(2, 1.0, 2.0 * sum(&G) * 1.05, &times(1.05), 1);
        for b in ddp.facts.stages[0].batches.iter_mut() {
            b.normaliser = Some(50.0);
            b.forward = b.forward.map(|l| l * 2.0);
            b.peeled = b.forward;
            b.root = b.forward;
        }
        ddp.header.normalised_by = Some(Framework::Transformers);
        ddp
    };
    let d = judged(&acc, &masked(counted(), [1.1, 0.93, 1.04, 0.97]));
    assert_eq!(d.reason, Reason::DropoutMasks, "{d:?}");
    // Counts that differ between the ranks are not cancelled: the loss stage, under dropout too.
    let mut ddp = counted();
    for b in ddp.facts.stages[0].batches.iter_mut() {
        b.normaliser = Some(if b.rank == 0 { 40.0 } else { 60.0 });
    }
    let d = judged(&acc, &masked(ddp, [1.1, 0.93, 1.04, 0.97]));
    assert_eq!(said(&d).0, "loss", "{d:?}");
}

#[test]
fn a_regrouped_steps_mean_loss_apart_at_step_0_is_the_loss_stage_by_its_loss_dtype() {
    // The same samples regrouped, every loss 1.001x on the ranks (label smoothing): the mean of
    // the step's losses parts beyond 16 float32 epsilons, where no micro-batch pairs.
    let mut acc = honest_acc();
    let mut ddp = leg(2, 0.5, 2.0 * sum(&G), &times(1.01), 1);
    holding(&mut acc, CONSECUTIVE);
    holding(&mut ddp, STRIDED);
    for b in &mut ddp.facts.stages[0].batches {
        b.forward = b.forward.map(|l| l * 1.001);
        b.peeled = b.peeled.map(|l| l * 1.001);
        b.root = b.root.map(|l| l * 1.001);
    }
    // Not known where the traces do not say the loss's dtype.
    assert_ne!(said(&judged(&acc, &ddp)).0, "loss");
    for t in [&mut acc, &mut ddp] {
        t.header.loss_dtype = Some(crate::spec::Dtype::Float32);
    }
    let d = judged(&acc, &ddp);
    assert_eq!(said(&d), ("loss", "script", None), "{d:?}");
    assert!(d.detail.contains("grouped otherwise into micro-batches of one size"), "{}", d.detail);
    // A bfloat16 loss rounds its mean at 2^-8: a 0.1% difference is no fact there.
    for t in [&mut acc, &mut ddp] {
        t.header.loss_dtype = Some(crate::spec::Dtype::Bfloat16);
    }
    assert_ne!(said(&judged(&acc, &ddp)).0, "loss");
}

#[test]
fn a_rank_under_another_autocast_is_the_precision_stage() {
    let acc = honest_acc();
    let mut ddp = leg(2, 0.5, 2.0 * sum(&G), &times(1.001), 1);
    for b in &mut ddp.facts.stages[0].batches {
        b.autocast = Some(if b.rank == 1 { 0 } else { 8 });
    }
    let d = judged(&acc, &ddp);
    assert_eq!((d.reason, said(&d).0), (Reason::PrecisionApart, "precision"), "{d:?}");
    assert!(d.detail.contains("rank 0 under bfloat16 autocast, rank 1 under autocast off"), "{}", d.detail);
}

#[test]
fn another_optimizers_gradients_apart_under_final_weights_equal_bit_for_bit_put_the_recording_in_doubt() {
    // No stage facts to walk; a second optimizer's parameter apart at a step, every final
    // weight alike (its gradients taken at the first optimizer's step, before the script
    // reduced them for its own).
    let (mut acc, mut ddp) = (honest_acc(), leg(2, 0.5, 2.0 * sum(&G), &G, 1));
    for t in [&mut acc, &mut ddp] {
        t.facts.stages.clear();
        t.finals.push(("optimizer1.0.0".into(), Values::f32s(vec![1.0])));
    }
    acc.steps[0].push(("optimizer1.0.0".into(), Values::f32s(vec![0.5])));
    ddp.steps[0].push(("optimizer1.0.0".into(), Values::f32s(vec![0.8])));
    let d = judged(&acc, &ddp);
    assert_eq!(d.reason, Reason::Unexplained, "{d:?}");
    assert!(
        d.detail.contains("the recording moment is in doubt") && d.detail.contains("optimizer1.0.0"),
        "{}",
        d.detail
    );
    // Its final weight apart too: no such doubt.
    ddp.finals[1].1 = Values::f32s(vec![1.5]);
    assert!(!judged(&acc, &ddp).detail.contains("in doubt"));
}

#[test]
fn sample_hashes_of_other_kinds_of_rows_are_no_evidence_of_other_samples() {
    // Every sample apart: other samples, where both hashed rows of one kind; where one leg
    // hashed a wrapper's batch ids and the other the model's inputs, nothing is compared.
    let mut acc = leg(1, 1.0, 4.0 * sum(&G), &times(4.0), 1);
    let mut ddp = leg(2, 1.0, 4.0 * sum(&G), &times(2.0), 1);
    holding(&mut acc, CONSECUTIVE);
    holding(&mut ddp, [[10, 11], [12, 13], [14, 15], [16, 17]]);
    acc.header.samples_from = Some("float32[8]".into());
    ddp.header.samples_from = Some("float32[8]".into());
    assert_eq!(said(&judged(&acc, &ddp)).0, "samples");
    ddp.header.samples_from = Some("int64[]".into());
    let d = judged(&acc, &ddp);
    assert_eq!(said(&d), ("scaling", "script", None), "{d:?}");
}
